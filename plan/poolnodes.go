package plan

import (
	"encoding/json"
	"iter"
)

// A pool's entries are kept in chunks of poolChunkLen, as Workers are: a
// grow or a shrink of one worker in a pool of 15,000 nodes changes one
// entry, and a plan that copies only that entry's chunk shares the other
// 2.7 MB of its pool list with the plan before it.
const (
	poolChunkShift = 8
	poolChunkLen   = 1 << poolChunkShift
)

// PoolChunkLen is the length of every chunk of PoolNodes but the last.
const PoolChunkLen = poolChunkLen

// PoolNodes is a pool's node entries in pool order. It is read-only once
// its plan is made; plans made one from another share the chunks neither
// changed. Its JSON is a list of entries (null for none, as a nil list).
type PoolNodes struct {
	chunks [][]PoolNode // nil: null; empty: []
	n      int
}

// NewPoolNodes wraps ns, which the result then owns: do not change ns
// after. A nil ns is no list (JSON null), an empty one an empty list.
func NewPoolNodes(ns []PoolNode) PoolNodes {
	if ns == nil {
		return PoolNodes{}
	}
	out := PoolNodes{chunks: make([][]PoolNode, 0, (len(ns)+poolChunkLen-1)/poolChunkLen), n: len(ns)}
	for i := 0; i < len(ns); i += poolChunkLen {
		end := min(i+poolChunkLen, len(ns))
		out.chunks = append(out.chunks, ns[i:end:end])
	}
	return out
}

// PoolNodesFromChunks makes PoolNodes of chunks, each PoolChunkLen long
// but the last: the planner's own way to build pools that share chunks.
// The chunks must not change after.
func PoolNodesFromChunks(chunks [][]PoolNode, n int) PoolNodes {
	if chunks == nil {
		chunks = [][]PoolNode{}
	}
	sum := 0
	for k, c := range chunks {
		if len(c) != poolChunkLen && (k < len(chunks)-1 || len(c) == 0) {
			sum = -1 // not NewPoolNodes's layout, which At and a comparison by chunk read
			break
		}
		sum += len(c)
	}
	if sum != n {
		var all []PoolNode
		for _, c := range chunks {
			all = append(all, c...)
		}
		if all == nil {
			all = []PoolNode{}
		}
		return NewPoolNodes(all)
	}
	return PoolNodes{chunks: chunks, n: n}
}

// Chunks is the entries' chunks, for a planner that builds the next plan
// sharing them: read-only.
func (p PoolNodes) Chunks() [][]PoolNode { return p.chunks }

// Len is the number of entries.
func (p PoolNodes) Len() int { return p.n }

// IsNil reports whether the list is none at all (JSON null), not an
// empty one.
func (p PoolNodes) IsNil() bool { return p.chunks == nil }

// At is the i-th entry, for reading.
func (p PoolNodes) At(i int) *PoolNode {
	return &p.chunks[i>>poolChunkShift][i&(poolChunkLen-1)]
}

// All yields every entry with its position, for reading.
func (p PoolNodes) All() iter.Seq2[int, *PoolNode] {
	return func(yield func(int, *PoolNode) bool) {
		i := 0
		for _, c := range p.chunks {
			for j := range c {
				if !yield(i, &c[j]) {
					return
				}
				i++
			}
		}
	}
}

// Slice copies the entries into one slice (nil for no list).
func (p PoolNodes) Slice() []PoolNode {
	if p.chunks == nil {
		return nil
	}
	out := make([]PoolNode, 0, p.n)
	for _, c := range p.chunks {
		out = append(out, c...)
	}
	return out
}

// MarshalJSON writes the entries as a JSON list, through encoding/json
// as a list of entries would be (AppendJSON's reference), chunk by chunk.
func (p PoolNodes) MarshalJSON() ([]byte, error) {
	if p.chunks == nil {
		return []byte("null"), nil
	}
	b := []byte{'['}
	for _, c := range p.chunks {
		if len(c) == 0 {
			continue
		}
		js, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, js[1:len(js)-1]...)
	}
	return append(b, ']'), nil
}

// appendJSON appends the entries as a JSON list (null for no list).
func (p PoolNodes) appendJSON(b []byte) []byte {
	if p.chunks == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, n := range p.All() {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendPoolNode(b, *n)
	}
	return append(b, ']')
}

// UnmarshalJSON reads a JSON list of entries; null reads as no list.
func (p *PoolNodes) UnmarshalJSON(b []byte) error {
	var ns []PoolNode
	if err := json.Unmarshal(b, &ns); err != nil {
		return err
	}
	*p = NewPoolNodes(ns)
	return nil
}
