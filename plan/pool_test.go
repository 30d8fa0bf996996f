package plan

import (
	"maps"
	"reflect"
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
	for _, n := range p.Nodes.All() {
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
		var nodes []PoolNode
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
			nodes = append(nodes, pn)
		}
		p.Nodes = NewPoolNodes(nodes)
		for _, c := range GPUComponents {
			if got, want := p.IndexString(c), indexStringRef(p, c); got != want {
				t.Fatalf("%s: %q, want %q", c, got, want)
			}
		}
		e := Export([]Pool{p}, ExportOptions{})[0]
		var counts []int
		for _, n := range p.Nodes.All() {
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

// TestExportAfterIsExport: the export of a pool written again only where
// its entries differ from a previous pool's (ExportAfter) is Export's,
// whatever options the previous export was made with, for pools whose
// entries are kept, replaced (by equal or other ones), appended, or put
// on other nodes or GPU counts (which it writes whole).
func TestExportAfterIsExport(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		entry := func(id string, gpus int, label string) PoolNode {
			pn := PoolNode{NodeID: id, TotalGPUs: gpus, Allocations: map[Component][]Range{}}
			for _, c := range GPUComponents {
				var gs []int
				for g := range gpus {
					if rapid.IntRange(0, 2).Draw(t, label+"held") == 0 {
						gs = append(gs, g)
					}
				}
				if len(gs) > 0 {
					pn.Allocations[c] = RangesOf(gs)
					*pn.WorkerCounts.Of(c) = []int{len(gs)}
				}
			}
			return pn
		}
		prev := Pool{Name: "p"}
		var prevNodes, nodes []PoolNode
		for i := range rapid.IntRange(0, 12).Draw(t, "nodes") {
			prevNodes = append(prevNodes, entry(strconv.Itoa(i), rapid.IntRange(0, 16).Draw(t, "gpus"), "prev"))
		}
		opts := func(label string) (bool, [3]int) {
			var counts [3]int
			for ci := range counts {
				counts[ci] = rapid.IntRange(0, 1).Draw(t, label+"counts")
			}
			return rapid.Bool().Draw(t, label+"ids"), counts
		}
		prev.Nodes = NewPoolNodes(prevNodes)
		prevIDs, prevCounts := opts("prev")
		prevOut := Export([]Pool{prev}, ExportOptions{NodeIDs: []bool{prevIDs}, Counts: prevCounts})[0]
		p := Pool{Name: "p"}
		for i, n := range prevNodes {
			switch rapid.IntRange(0, 6).Draw(t, "change") {
			case 0: // another entry on the node
				nodes = append(nodes, entry(n.NodeID, n.TotalGPUs, "next"))
			case 1: // an equal entry, not the same one
				c := n
				c.Allocations = maps.Clone(n.Allocations)
				nodes = append(nodes, c)
			case 2: // other allocations beside the same counts
				c := n
				c.Allocations = entry(n.NodeID, n.TotalGPUs, "next").Allocations
				nodes = append(nodes, c)
			case 3:
				if rapid.IntRange(0, 3).Draw(t, "other") == 0 { // another node or GPU count
					nodes = append(nodes, entry(strconv.Itoa(i+100*rapid.IntRange(0, 1).Draw(t, "id")), rapid.IntRange(0, 16).Draw(t, "gpus"), "next"))
					continue
				}
				fallthrough
			default:
				nodes = append(nodes, n)
			}
		}
		for i := range rapid.IntRange(0, 3).Draw(t, "joined") {
			nodes = append(nodes, entry(strconv.Itoa(200+i), rapid.IntRange(0, 16).Draw(t, "gpus"), "joined"))
		}
		if rapid.IntRange(0, 5).Draw(t, "cut") == 0 && len(nodes) > 0 {
			nodes = nodes[:rapid.IntRange(0, len(nodes)-1).Draw(t, "left")]
		}
		p.Nodes = NewPoolNodes(nodes)
		ids, counts := opts("next")
		got := ExportAfter(prev, prevOut, p, ids, counts)
		want := Export([]Pool{p}, ExportOptions{NodeIDs: []bool{ids}, Counts: counts})[0]
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ExportAfter:\n%+v\nExport:\n%+v", got, want)
		}
	})
}

// TestIndexCut: the cut of an index string at a GPU is the start of its
// first range at or beyond that GPU.
func TestIndexCut(t *testing.T) {
	s := "0-7, 9, 12-15, 100"
	for _, tc := range []struct{ x, want int }{
		{0, 0}, {1, 5}, {8, 5}, {9, 5}, {10, 8}, {12, 8}, {13, 15}, {100, 15}, {101, len(s)},
	} {
		if got := indexCut(s, tc.x); got != tc.want {
			t.Errorf("indexCut(%q, %d) = %d, want %d", s, tc.x, got, tc.want)
		}
	}
	if got := indexCut("", 3); got != 0 {
		t.Errorf("indexCut of none = %d, want 0", got)
	}
}
