package planner

import (
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

const (
	chunkLen   = plan.ChunkLen
	chunkShift = 9 // log2(chunkLen)
)

// workerStore is one run's workers: chunks of a previous plan, copied on
// the first write that changes them, and chunks of its own.
type workerStore struct {
	chunks [][]plan.Worker
	own    []bool
	n      int
	// written marks the slots set in this run, where the store started
	// over a previous plan's workers for a run that sets every slot it
	// places afresh (storeOver); nil otherwise.
	written []uint64
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

// storeOver holds n slots for a run that places every worker afresh (a
// planner that restarted reads its plan back and takes that path), over
// prev's workers: each whole chunk of prev that fits is shared, so the
// workers the run places where they were cost nothing, and a chunk is
// copied only where a worker differs. Slots the run leaves unset read
// as empty once clearUnset ran, as in a newStore.
func storeOver(prev plan.Workers, n int) *workerStore {
	pcs := prev.Chunks()
	s := &workerStore{n: n, written: make([]uint64, (n+63)/64)}
	for k := 0; k<<chunkShift < n; k++ {
		size := min(chunkLen, n-k<<chunkShift)
		if k < len(pcs) && len(pcs[k]) == size {
			s.chunks, s.own = append(s.chunks, pcs[k]), append(s.own, false)
			continue
		}
		s.chunks, s.own = append(s.chunks, make([]plan.Worker, size)), append(s.own, true)
	}
	return s
}

// clearUnset empties the slots storeOver's run did not set (they held
// the previous plan's workers) and ends the tracking.
func (s *workerStore) clearUnset() {
	if s.written == nil {
		return
	}
	written := s.written
	s.written = nil
	for i := range s.n {
		if written[i>>6]&(1<<(i&63)) == 0 && !isEmpty(s.at(i)) {
			s.set(i, plan.Worker{})
		}
	}
}

func isEmpty(w *plan.Worker) bool {
	return w.Component == "" && w.Index == 0 && w.Pool == "" && w.NodeID == "" && w.IP == "" && w.GPUs == nil &&
		w.GPUUUIDs == nil && w.GPUShare == 0 && w.CPUs == 0
}

// sameWorker reports whether a and b are the same worker in every field.
func sameWorker(a, b *plan.Worker) bool {
	return a.Component == b.Component && a.Index == b.Index && a.Pool == b.Pool && a.NodeID == b.NodeID && a.IP == b.IP &&
		slices.Equal(a.GPUs, b.GPUs) && slices.Equal(a.GPUUUIDs, b.GPUUUIDs) && (a.GPUs == nil) == (b.GPUs == nil) &&
		(a.GPUUUIDs == nil) == (b.GPUUUIDs == nil) && a.GPUShare == b.GPUShare && a.CPUs == b.CPUs
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
	if s.written != nil {
		// Slots added are empty already: the tracking covers those storeOver
		// shared, which a resize never adds.
		s.written = append(s.written, make([]uint64, max(0, (n+63)/64-len(s.written)))...)
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
	if s.written != nil {
		s.written[i>>6] |= 1 << (i & 63)
	}
	if !s.own[k] {
		if sameWorker(&s.chunks[k][i&(chunkLen-1)], &w) {
			return
		}
		s.chunks[k] = append([]plan.Worker(nil), s.chunks[k]...)
		s.own[k] = true
	}
	s.chunks[k][i&(chunkLen-1)] = w
}

func (s *workerStore) workers() plan.Workers {
	return plan.FromChunks(append([][]plan.Worker(nil), s.chunks...), s.n)
}
