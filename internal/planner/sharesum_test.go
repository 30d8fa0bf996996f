package planner

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

// TestHeldSharesFromProperty: over chains of inventory changes, the
// shares summed from the previous plan's and the touched nodes are the
// plan's summed whole.
func TestHeldSharesFromProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genReplanSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		prev, err := Compute(spec, nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		shares := HeldSharesFrom(nil, prev, 0)
		for step := range rapid.IntRange(1, 4).Draw(t, "steps") {
			after, _ := change(t, nodes, step)
			if len(after) == 0 {
				return
			}
			next, _, err := Replan(prev, spec, after)
			if err != nil || !next.Placed() {
				return
			}
			shares = HeldSharesFrom(prev, next, shares)
			if want := HeldShares(next); math.Abs(shares-want) > 1e-9 {
				t.Fatalf("step %d: HeldSharesFrom = %v, HeldShares = %v", step, shares, want)
			}
			prev, nodes = next, after
		}
	})
}
