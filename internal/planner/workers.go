package planner

import "github.com/poolplanner/poolplanner/plan"

const (
	chunkLen   = plan.ChunkLen
	chunkShift = 9 // log2(chunkLen)
)

// workerStore is one run's workers: chunks of a previous plan, copied on
// the first write, and chunks of its own.
type workerStore struct {
	chunks [][]plan.Worker
	own    []bool
	n      int
}

// newStore holds n empty worker slots, in one allocation.
func newStore(n int) *workerStore {
	s := &workerStore{}
	s.adopt(plan.NewWorkers(make([]plan.Worker, n)), true)
	return s
}

// storeFrom starts from prev's workers, sharing every chunk until written.
func storeFrom(prev plan.Workers) *workerStore {
	s := &workerStore{}
	s.adopt(prev, false)
	return s
}

func (s *workerStore) adopt(ws plan.Workers, own bool) {
	s.chunks = append([][]plan.Worker(nil), ws.Chunks()...)
	s.own = make([]bool, len(s.chunks))
	for i := range s.own {
		s.own[i] = own
	}
	s.n = ws.Len()
}

// resize makes the store n slots long; new slots are empty.
func (s *workerStore) resize(n int) {
	if n == s.n {
		return
	}
	want := (n + chunkLen - 1) >> chunkShift
	if want < len(s.chunks) {
		s.chunks, s.own = s.chunks[:want], s.own[:want]
	}
	for len(s.chunks) < want {
		s.chunks = append(s.chunks, nil)
		s.own = append(s.own, true)
	}
	for k := range s.chunks {
		size := min(chunkLen, n-k<<chunkShift)
		if len(s.chunks[k]) == size {
			continue
		}
		c := make([]plan.Worker, size)
		copy(c, s.chunks[k])
		s.chunks[k], s.own[k] = c, true
	}
	s.n = n
}

func (s *workerStore) at(i int) *plan.Worker { return &s.chunks[i>>chunkShift][i&(chunkLen-1)] }

// set writes slot i, copying its chunk first if a previous plan owns it.
func (s *workerStore) set(i int, w plan.Worker) {
	k := i >> chunkShift
	if !s.own[k] {
		s.chunks[k] = append([]plan.Worker(nil), s.chunks[k]...)
		s.own[k] = true
	}
	s.chunks[k][i&(chunkLen-1)] = w
}

func (s *workerStore) workers() plan.Workers {
	return plan.FromChunks(append([][]plan.Worker(nil), s.chunks...), s.n)
}
