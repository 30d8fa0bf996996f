package plan

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// TestPoolNodesJSON: a pool's entries read back from their JSON are the
// entries written, in chunks laid out as NewPoolNodes lays them (so that
// a document read back compares equal to the one made), for no list
// (null), an empty one, and lists within one chunk, at a chunk's end and
// across several.
func TestPoolNodesJSON(t *testing.T) {
	entries := func(n int) []PoolNode {
		out := make([]PoolNode, n)
		for i := range out {
			out[i] = PoolNode{NodeID: fmt.Sprintf("n%d", i), TotalGPUs: 8, Allocations: map[Component][]Range{Eval: {{First: 0, Last: i % 8}}},
				WorkerCounts: GroupCounts{Eval: []int{i%8 + 1}}}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []PoolNode
		json string // "" : not checked
	}{
		{"none", nil, "null"},
		{"empty", []PoolNode{}, "[]"},
		{"one", entries(1), ""},
		{"a chunk", entries(PoolChunkLen), ""},
		{"a chunk and one", entries(PoolChunkLen + 1), ""},
		{"several", entries(3*PoolChunkLen + 7), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPoolNodes(tc.in)
			if p.Len() != len(tc.in) || p.IsNil() != (tc.in == nil) {
				t.Fatalf("len %d nil %v, want %d %v", p.Len(), p.IsNil(), len(tc.in), tc.in == nil)
			}
			for i, n := range p.All() {
				if n != p.At(i) || n.NodeID != tc.in[i].NodeID {
					t.Fatalf("entry %d: %s, want %s", i, n.NodeID, tc.in[i].NodeID)
				}
			}
			b, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if tc.json != "" && string(b) != tc.json {
				t.Fatalf("JSON %s, want %s", b, tc.json)
			}
			want, _ := json.Marshal(tc.in)
			if string(b) != string(want) {
				t.Fatalf("JSON %s, want the list's %s", b, want)
			}
			if a := p.appendJSON(nil); string(a) != string(want) {
				t.Fatalf("AppendJSON's %s, want encoding/json's %s", a, want)
			}
			var back PoolNodes
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, p) || !reflect.DeepEqual(back.Slice(), tc.in) {
				t.Fatalf("read back %+v, want %+v", back, p)
			}
		})
	}
	var p PoolNodes
	if err := json.Unmarshal([]byte(`{"node_id": "n"}`), &p); err == nil {
		t.Fatal("an object read as a list of entries")
	}
}

// TestPoolNodesFromChunks: chunks laid out otherwise than NewPoolNodes
// lays them are laid out again, so that At and comparisons by chunk
// read them right.
func TestPoolNodesFromChunks(t *testing.T) {
	e := func(id string) PoolNode { return PoolNode{NodeID: id} }
	full := make([]PoolNode, PoolChunkLen)
	for i := range full {
		full[i] = e(fmt.Sprint(i))
	}
	for _, tc := range []struct {
		name   string
		chunks [][]PoolNode
		n      int
	}{
		{"as laid out", [][]PoolNode{full, {e("x")}}, PoolChunkLen + 1},
		{"short first chunk", [][]PoolNode{{e("a")}, {e("b"), e("c")}}, 3},
		{"empty last chunk", [][]PoolNode{full, {}}, PoolChunkLen},
		{"wrong count", [][]PoolNode{{e("a")}}, 2},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var all []PoolNode
			for _, c := range tc.chunks {
				all = append(all, c...)
			}
			if all == nil {
				all = []PoolNode{}
			}
			got := PoolNodesFromChunks(tc.chunks, tc.n)
			if want := NewPoolNodes(all); !reflect.DeepEqual(got, want) {
				t.Fatalf("%d entries in %d chunks, want %d in %d", got.Len(), len(got.Chunks()), want.Len(), len(want.Chunks()))
			}
			for i := range all {
				if got.At(i).NodeID != all[i].NodeID {
					t.Fatalf("entry %d: %s, want %s", i, got.At(i).NodeID, all[i].NodeID)
				}
			}
		})
	}
}
