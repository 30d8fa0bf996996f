package planner

import (
	"encoding/json"
	"iter"
	"sort"
)

// Workers are kept in chunks of chunkLen. A replan copies only the chunks
// it changes: moving 32 workers of a 400,000-worker plan copies a few
// chunks instead of 54 MB, which on these machines costs more than
// planning the cluster afresh.
const (
	chunkShift = 9
	chunkLen   = 1 << chunkShift
)

// Workers is a plan's workers in document order: train, eval and env, each
// by index, then buffers by index. It is read-only once its plan is made;
// plans made one from another share the chunks neither changed.
type Workers struct {
	chunks [][]Worker
	n      int
}

// NewWorkers wraps ws, which the result then owns: do not change ws after.
func NewWorkers(ws []Worker) Workers {
	out := Workers{n: len(ws)}
	for i := 0; i < len(ws); i += chunkLen {
		end := min(i+chunkLen, len(ws))
		out.chunks = append(out.chunks, ws[i:end:end])
	}
	return out
}

// Len is the number of workers.
func (ws Workers) Len() int { return ws.n }

// At is the i-th worker, for reading.
func (ws Workers) At(i int) *Worker { return &ws.chunks[i>>chunkShift][i&(chunkLen-1)] }

// All yields every worker with its position, for reading.
func (ws Workers) All() iter.Seq2[int, *Worker] {
	return func(yield func(int, *Worker) bool) {
		i := 0
		for _, c := range ws.chunks {
			for j := range c {
				if !yield(i, &c[j]) {
					return
				}
				i++
			}
		}
	}
}

// Find is the worker of component c with index i, or nil. Plans keep
// workers in Component.Rank order, so it searches (a lookup is the
// service's most frequent request); a document in another order is
// scanned.
func (ws Workers) Find(c Component, i int) *Worker {
	rank := c.Rank()
	if rank < 0 {
		return nil
	}
	k := sort.Search(ws.n, func(k int) bool {
		w := ws.At(k)
		r := w.Component.Rank()
		return r > rank || (r == rank && w.Index >= i)
	})
	if k < ws.n && ws.At(k).Component == c && ws.At(k).Index == i {
		return ws.At(k)
	}
	for _, w := range ws.All() {
		if w.Component == c && w.Index == i {
			return w
		}
	}
	return nil
}

// Slice copies the workers into one slice.
func (ws Workers) Slice() []Worker {
	out := make([]Worker, 0, ws.n)
	for _, c := range ws.chunks {
		out = append(out, c...)
	}
	return out
}

// MarshalJSON writes the workers as a JSON list.
func (ws Workers) MarshalJSON() ([]byte, error) { return ws.appendJSON(nil), nil }

func (ws Workers) appendJSON(b []byte) []byte {
	b = append(b, '[')
	for i, w := range ws.All() {
		if i > 0 {
			b = append(b, ',')
		}
		b = w.appendJSON(b)
	}
	return append(b, ']')
}

// UnmarshalJSON reads a JSON list of workers; null reads as none.
func (ws *Workers) UnmarshalJSON(b []byte) error {
	var list []Worker
	if err := json.Unmarshal(b, &list); err != nil {
		return err
	}
	*ws = NewWorkers(list)
	return nil
}

// workerStore is one run's workers: chunks of a previous plan, copied on
// the first write, and chunks of its own.
type workerStore struct {
	chunks [][]Worker
	own    []bool
	n      int
}

// newStore holds n empty worker slots, in one allocation.
func newStore(n int) *workerStore {
	s := &workerStore{}
	s.adopt(NewWorkers(make([]Worker, n)), true)
	return s
}

// storeFrom starts from prev's workers, sharing every chunk until written.
func storeFrom(prev Workers) *workerStore {
	s := &workerStore{}
	s.adopt(prev, false)
	return s
}

func (s *workerStore) adopt(ws Workers, own bool) {
	s.chunks = append([][]Worker(nil), ws.chunks...)
	s.own = make([]bool, len(s.chunks))
	for i := range s.own {
		s.own[i] = own
	}
	s.n = ws.n
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
		c := make([]Worker, size)
		copy(c, s.chunks[k])
		s.chunks[k], s.own[k] = c, true
	}
	s.n = n
}

func (s *workerStore) at(i int) *Worker { return &s.chunks[i>>chunkShift][i&(chunkLen-1)] }

// set writes slot i, copying its chunk first if a previous plan owns it.
func (s *workerStore) set(i int, w Worker) {
	k := i >> chunkShift
	if !s.own[k] {
		s.chunks[k] = append([]Worker(nil), s.chunks[k]...)
		s.own[k] = true
	}
	s.chunks[k][i&(chunkLen-1)] = w
}

func (s *workerStore) workers() Workers {
	return Workers{chunks: append([][]Worker(nil), s.chunks...), n: s.n}
}
