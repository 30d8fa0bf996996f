package planner

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// movedByIndex is CountMoved as it is defined: every worker of next not
// found, by component and index, where prev has it (the last of prev's
// repeats counts).
func movedByIndex(prev, next *Plan) int {
	old := indexWorkers(prev.Workers)
	n := 0
	for _, w := range next.Workers.All() {
		if o := old.get(w.Component, w.Index); o == nil || !samePlace(o, w) {
			n++
		}
	}
	return n
}

// genWorkers is a worker list in the planner's order, or now and then
// shuffled, with repeats or odd indices.
func genWorkers(t *rapid.T, label string) *Plan {
	var ws []plan.Worker
	for _, c := range []plan.Component{plan.Train, plan.Eval, plan.Env, plan.Buffer} {
		for i := range rapid.IntRange(0, 6).Draw(t, fmt.Sprintf("%s.%s", label, c)) {
			ws = append(ws, plan.Worker{Component: c, Index: i,
				NodeID: fmt.Sprintf("n%d", rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("%s.%s%d.node", label, c, i))),
				GPUs:   []int{rapid.IntRange(0, 1).Draw(t, fmt.Sprintf("%s.%s%d.gpu", label, c, i))}})
		}
	}
	switch rapid.IntRange(0, 5).Draw(t, label+".disorder") {
	case 0:
		if len(ws) > 1 {
			i, j := rapid.IntRange(0, len(ws)-1).Draw(t, label+".i"), rapid.IntRange(0, len(ws)-1).Draw(t, label+".j")
			ws[i], ws[j] = ws[j], ws[i]
		}
	case 1:
		if len(ws) > 0 {
			k := rapid.IntRange(0, len(ws)-1).Draw(t, label+".repeat")
			w := ws[k]
			w.NodeID += "x"
			ws = slices.Insert(ws, rapid.IntRange(0, len(ws)).Draw(t, label+".at"), w)
		}
	case 2:
		if len(ws) > 0 {
			ws[rapid.IntRange(0, len(ws)-1).Draw(t, label+".odd")].Index = -1
		}
	}
	p := &Plan{}
	p.Workers = plan.NewWorkers(ws)
	return p
}

// TestCountMovedInOrder: CountMoved's walk over two lists in order
// counts what its definition counts, and lists out of order, repeated or
// odd are counted by the definition itself.
func TestCountMovedInOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prev, next := genWorkers(t, "prev"), genWorkers(t, "next")
		if got, want := CountMoved(prev, next), movedByIndex(prev, next); got != want {
			t.Fatalf("moved %d, want %d\nprev %s\nnext %s", got, want, placementOf(prev), placementOf(next))
		}
	})
}
