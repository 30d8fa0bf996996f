package plan

import "strconv"

// The pool API, shaped as rlightning's ResourcePool: what the export and
// the text output are written from.

// TotalGPUs is the GPUs of the pool's nodes.
func (p Pool) TotalGPUs() int {
	t := 0
	for _, n := range p.Nodes {
		t += n.TotalGPUs
	}
	return t
}

// IndexString is the component's GPUs in the pool-global index space:
// nodes concatenated in pool order, each offset by the GPUs of the nodes
// before it, never merged across nodes ("0-7, 8-11").
func (p Pool) IndexString(c Component) string {
	var b []byte
	off := 0
	for _, n := range p.Nodes {
		for _, r := range n.Allocations[c] {
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = strconv.AppendInt(b, int64(r.First+off), 10)
			if r.Last != r.First {
				b = append(b, '-')
				b = strconv.AppendInt(b, int64(r.Last+off), 10)
			}
		}
		off += n.TotalGPUs
	}
	return string(b)
}

// WorkerCounts is, per pool node, the component's workers there per
// scheduling group; nil when it has none in the pool.
func (p Pool) WorkerCounts(c Component, groups int) [][]int {
	var out [][]int
	for i := range p.Nodes {
		if counts := *p.Nodes[i].WorkerCounts.Of(c); len(counts) > 0 {
			if out == nil {
				out = make([][]int, len(p.Nodes))
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
