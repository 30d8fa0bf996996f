package plan

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestInDocumentOrder: workers placed straight by index come out as a
// sort by component and index puts them, whether their indices run
// 0..n-1 in each component (a plan's) or not (gaps, repeats, a component
// not known: sorted).
func TestInDocumentOrder(t *testing.T) {
	comps := []Component{Train, Eval, Env, Buffer, "bogus"}
	rapid.Check(t, func(t *rapid.T) {
		var ws []Worker
		dense := rapid.Bool().Draw(t, "dense")
		for _, c := range comps[:rapid.IntRange(1, len(comps)).Draw(t, "components")] {
			n := rapid.IntRange(0, 20).Draw(t, "n")
			for i := range n {
				idx := i
				if !dense {
					idx = rapid.IntRange(-1, n+2).Draw(t, "index")
				}
				ws = append(ws, Worker{Component: c, Index: idx, NodeID: "n"})
			}
		}
		ws = rapid.Permutation(ws).Draw(t, "order")
		got := inDocumentOrder(slices.Clone(ws))
		want := sortWorkers(slices.Clone(ws))
		key := func(w Worker) [2]int { return [2]int{w.Component.Rank(), w.Index} }
		if !slices.EqualFunc(got, want, func(a, b Worker) bool { return key(a) == key(b) }) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
}
