package planner

import (
	"testing"

	"pgregory.net/rapid"
)

// TestAdoptPathsAgree: a replan starts from the previous run's state
// when it has it (adoptFast: work in proportion to what changed) and
// from the document otherwise (adoptSlow: a planner restarted, reading
// its plan back from the stream). They are one rule at two costs: the
// same change to the same plan places alike either way, so a planner
// that restarted moves no worker one that kept running would not.
func TestAdoptPathsAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genReplanSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		prev, err := Compute(spec, nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		for step := range rapid.IntRange(1, 3).Draw(t, "steps") {
			after, _ := change(t, nodes, step)
			if len(after) == 0 {
				return
			}
			fast, _, errFast := Replan(prev, spec, after)
			slow, _, errSlow := Replan(readBack(t, prev), spec, after)
			if (errFast == nil) != (errSlow == nil) {
				t.Fatalf("step %d: from the run's state: %v; from the document: %v", step, errFast, errSlow)
			}
			if !SamePlacement(fast, slow) {
				t.Fatalf("step %d: placements differ:\nfrom the run's state: %s\nfrom the document:    %s", step, snapshot(fast), snapshot(slow))
			}
			// Every field of every worker, not only where it is: the
			// slow path's store starts over the document's workers
			// (storeOver), and a slot it leaves unset must not keep one.
			if errFast == nil {
				fj, _ := fast.Workers.MarshalJSON()
				sj, _ := slow.Workers.MarshalJSON()
				if string(fj) != string(sj) {
					t.Fatalf("step %d: workers differ:\nfrom the run's state: %s\nfrom the document:    %s", step, fj, sj)
				}
			}
			if !fast.Placed() {
				return
			}
			prev, nodes = fast, after
		}
	})
}
