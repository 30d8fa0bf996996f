package plan

import (
	"slices"
	"strconv"
	"testing"

	"pgregory.net/rapid"
)

// indexStringRef is IndexString as first written: one append after
// another.
func indexStringRef(p Pool, c Component) string {
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

// TestIndexStringAgrees: the index string counted first and written
// once is the one appended piece by piece, on pools of nodes of any GPU
// counts and allocations (none, single GPUs, ranges), and Export gives
// num_gpus one number exactly when every node has the same count.
func TestIndexStringAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var p Pool
		for i := range rapid.IntRange(0, 12).Draw(t, "nodes") {
			gpus := rapid.IntRange(0, 16).Draw(t, "gpus")
			pn := PoolNode{NodeID: strconv.Itoa(i), TotalGPUs: gpus, Allocations: map[Component][]Range{}}
			for _, c := range GPUComponents {
				var gs []int
				for g := range gpus {
					if rapid.IntRange(0, 2).Draw(t, "held") == 0 {
						gs = append(gs, g)
					}
				}
				if len(gs) > 0 {
					pn.Allocations[c] = RangesOf(gs)
				}
			}
			p.Nodes = append(p.Nodes, pn)
		}
		for _, c := range GPUComponents {
			if got, want := p.IndexString(c), indexStringRef(p, c); got != want {
				t.Fatalf("%s: %q, want %q", c, got, want)
			}
		}
		e := Export([]Pool{p}, ExportOptions{})[0]
		var counts []int
		for _, n := range p.Nodes {
			counts = append(counts, n.TotalGPUs)
		}
		want := counts
		if len(counts) == 0 {
			want = []int{0}
		} else if !slices.ContainsFunc(counts, func(g int) bool { return g != counts[0] }) {
			want = counts[:1]
		}
		if !slices.Equal(e.NumGPUs, want) {
			t.Fatalf("num_gpus %v, want %v", e.NumGPUs, want)
		}
	})
}
