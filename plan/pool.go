package plan

import (
	"strconv"
	"strings"
)

// The pool API, shaped as rlightning's ResourcePool: what the export and
// the text output are written from.

// TotalGPUs is the GPUs of the pool's nodes.
func (p Pool) TotalGPUs() int {
	t := 0
	for _, n := range p.Nodes.All() {
		t += n.TotalGPUs
	}
	return t
}

// IndexString is the component's GPUs in the pool-global index space:
// nodes concatenated in pool order, each offset by the GPUs of the nodes
// before it, never merged across nodes ("0-7, 8-11").
func (p Pool) IndexString(c Component) string {
	// Written twice: once to count its length, then into a buffer of
	// that size, so that a pool of 120,000 GPUs makes its string in one
	// allocation rather than a doubling buffer and a copy (1.2 MB).
	var num [20]byte
	n := 0
	p.eachRange(c, func(first, last int) {
		if n > 0 {
			n += len(", ")
		}
		n += len(strconv.AppendInt(num[:0], int64(first), 10))
		if last != first {
			n += 1 + len(strconv.AppendInt(num[:0], int64(last), 10))
		}
	})
	var b strings.Builder
	b.Grow(n)
	p.eachRange(c, func(first, last int) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.Write(strconv.AppendInt(num[:0], int64(first), 10))
		if last != first {
			b.WriteByte('-')
			b.Write(strconv.AppendInt(num[:0], int64(last), 10))
		}
	})
	return b.String()
}

// eachRange calls fn for each of the component's ranges in the
// pool-global index space, in pool order.
func (p Pool) eachRange(c Component, fn func(first, last int)) {
	off := 0
	for _, n := range p.Nodes.All() {
		for _, r := range n.Allocations[c] {
			fn(r.First+off, r.Last+off)
		}
		off += n.TotalGPUs
	}
}

// WorkerCounts is, per pool node, the component's workers there per
// scheduling group; nil when it has none in the pool.
func (p Pool) WorkerCounts(c Component, groups int) [][]int {
	var out [][]int
	for i := range p.Nodes.All() {
		if counts := *p.Nodes.At(i).WorkerCounts.Of(c); len(counts) > 0 {
			if out == nil {
				out = make([][]int, p.Nodes.Len())
			}
			out[i] = counts
		}
	}
	zero := make([]int, groups) // shared: the counts are read-only
	for i := range out {
		if out[i] == nil {
			out[i] = zero
		}
	}
	return out
}
