package planner

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// TestEachInAgrees: the workers eachIn finds of an elastic group's
// index range (by search, in a plan the planner made) are exactly those
// a scan of every worker finds, on plans valid and degraded, and on a
// plan whose workers are out of the planner's order (read by the scan).
func TestEachInAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec, from, _ := genResizeSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		p, err := Compute(sized(spec, []int{from}), nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		if rapid.Bool().Draw(t, "replanned") {
			// A replan after inventory changes: degraded where room is short,
			// its unplaced workers listed.
			after := nodes
			for step := range rapid.IntRange(1, 2).Draw(t, "steps") {
				if next, _ := change(t, after, step); len(next) > 0 {
					after = next
				}
			}
			if q, _, _ := Replan(p, sized(spec, []int{from}), after); q.Placed() {
				p = q
			}
		}
		if rapid.Bool().Draw(t, "reversed") {
			q := *p
			ws := q.Workers.Slice()
			slices.Reverse(ws)
			q.Workers = plan.NewWorkers(ws)
			p = &q
		}
		refs := elasticRefs(spec)
		hi := rapid.IntRange(0, from+1).Draw(t, "hi")
		lo := rapid.IntRange(0, hi).Draw(t, "lo")
		type key struct {
			c plan.Component
			i int
		}
		var got, want []key
		eachIn(p, refs, []int{lo}, []int{hi}, func(w *plan.Worker) { got = append(got, key{w.Component, w.Index}) })
		r := refs[0]
		for _, w := range p.Workers.All() {
			if w.Component == r.c && w.Index >= r.first+lo && w.Index < r.first+hi {
				want = append(want, key{w.Component, w.Index})
			}
		}
		order := func(x, y key) int { return x.i - y.i }
		slices.SortFunc(got, order)
		slices.SortFunc(want, order)
		if !slices.Equal(got, want) {
			t.Fatalf("%s %d..%d of %d (unplaced %v): found %v, want %v", r, lo, hi, from, p.Unplaced, got, want)
		}
	})
}
