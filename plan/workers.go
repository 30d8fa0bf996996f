package plan

import (
	"bytes"
	"encoding/json"
	"iter"
	"reflect"
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
func (ws Workers) MarshalJSON() ([]byte, error) { return ws.appendJSON(nil, nil), nil }

// appendJSON appends the workers as a JSON list; flush, when not nil,
// is given the buffer after each worker and returns what to go on with.
func (ws Workers) appendJSON(b []byte, flush func([]byte) []byte) []byte {
	b = append(b, '[')
	for i, w := range ws.All() {
		if i > 0 {
			b = append(b, ',')
		}
		b = w.appendJSON(b)
		if flush != nil {
			b = flush(b)
		}
	}
	return append(b, ']')
}

// UnmarshalJSON reads a JSON list of workers; null reads as none. It
// decodes straight into chunks, not into one slice grown by appending
// (at 400,000 workers that is some 200 MB of garbage and a quarter's
// spare capacity kept), and the workers of one list share their
// repeated strings (component, pool, node, IP, GPU UUIDs) rather than
// each holding its copies.
func (ws *Workers) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		*ws = Workers{}
		return nil
	}
	if tok != json.Delim('[') {
		return &json.UnmarshalTypeError{Value: jsonKind(tok), Type: reflect.TypeFor[[]Worker](), Offset: dec.InputOffset()}
	}
	var out Workers
	var cur []Worker
	seen := map[string]string{}
	same := func(s string) string {
		if t, ok := seen[s]; ok {
			return t
		}
		seen[s] = s
		return s
	}
	for dec.More() {
		if len(cur) == cap(cur) {
			if cur != nil {
				out.chunks = append(out.chunks, cur)
			}
			cur = make([]Worker, 0, chunkLen)
		}
		cur = cur[:len(cur)+1]
		w := &cur[len(cur)-1]
		if err := dec.Decode(w); err != nil {
			return err
		}
		w.Component, w.Pool, w.NodeID, w.IP = Component(same(string(w.Component))), same(w.Pool), same(w.NodeID), same(w.IP)
		for i, u := range w.GPUUUIDs {
			w.GPUUUIDs[i] = same(u)
		}
		out.n++
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return err
	}
	if len(cur) > 0 {
		out.chunks = append(out.chunks, cur[:len(cur):len(cur)])
	}
	*ws = out
	return nil
}

// jsonKind names a JSON value by its kind, as encoding/json's type
// errors do ("string", "number", "object"), never by the value itself,
// which may be long or not the reader's to see.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "bool"
	case json.Delim:
		return "object" // '[' is the list itself; '}' and ']' are syntax errors before this
	}
	return "value"
}

// Chunks is the workers' chunks, for a planner that builds the next plan
// sharing them: read-only.
func (ws Workers) Chunks() [][]Worker { return ws.chunks }

// FromChunks makes Workers of chunks, each chunkLen long but the last
// (ChunkLen): the planner's own way to build plans that share chunks. The
// chunks must not change after.
func FromChunks(chunks [][]Worker, n int) Workers { return Workers{chunks: chunks, n: n} }

// ChunkLen is the length of every chunk of Workers but the last.
const ChunkLen = chunkLen
