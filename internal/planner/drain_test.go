package planner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestReplanDrained: a drained node or GPU is left by exactly its
// workers, each displaced for WhyDrained, and gets no new ones; where no
// room is left the plan degrades, its unplaced workers saying the drain
// is why; undraining moves nobody.
func TestReplanDrained(t *testing.T) {
	spec := mustSpec(t, "scheduling:\n  train: {worker_num: 24, num_cpus: 1, num_gpus: 1}\n  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}\n")
	nodes := uniformNodes(4, 8, 32)
	first, _, err := Replan(nil, spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	w0 := *first.Workers.Find(plan.Train, 0)
	cases := []struct {
		name  string
		drain func(*Node)
		where string
		// full: the drain leaves no room (every node drained but one).
		lost map[workerKey]bool
	}{
		{"node", func(n *Node) { n.Out, n.Drained = true, []int{0, 1, 2, 3, 4, 5, 6, 7} }, w0.NodeID, workersOn(first, w0.NodeID)},
		{"gpu", func(n *Node) { n.Drained = []int{w0.GPUs[0]} }, fmt.Sprintf("%s:%d", w0.NodeID, w0.GPUs[0]),
			map[workerKey]bool{{plan.Train, 0}: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			drained := withNode(nodes, w0.NodeID, c.drain)
			next, ch, err := Replan(first, spec, drained)
			if err != nil || ch.Fresh {
				t.Fatalf("replan: err %v, change %+v", err, ch)
			}
			checkStrict(t, spec, drained, next)
			for _, d := range ch.Displaced {
				if d.Component == plan.Buffer {
					continue
				}
				if !c.lost[workerKey{d.Component, d.Index}] || d.Why != WhyDrained || d.Where != c.where {
					t.Errorf("displaced %+v, want only the workers of %s, for %q", d, c.where, WhyDrained)
				}
			}
			for _, w := range next.Workers.All() {
				o := first.Workers.Find(w.Component, w.Index)
				if w.Component == plan.Buffer {
					if c.name == "node" && w.NodeID == w0.NodeID {
						t.Errorf("buffer %d stays on the drained node", w.Index)
					}
					continue
				}
				if c.lost[workerKey{w.Component, w.Index}] {
					if samePlace(o, w) || c.name == "node" && w.NodeID == w0.NodeID {
						t.Errorf("%s %d stayed on %s%v", w.Component, w.Index, w.NodeID, w.GPUs)
					}
				} else if !samePlace(o, w) {
					t.Errorf("%s %d moved from %s%v to %s%v", w.Component, w.Index, o.NodeID, o.GPUs, w.NodeID, w.GPUs)
				}
			}
			if got := ch.Summary(); !strings.Contains(got, WhyDrained+" "+c.where) {
				t.Errorf("summary %q does not say %s is drained", got, c.where)
			}
			back, ch, err := Replan(next, spec, nodes)
			if err != nil || len(ch.Displaced) != 0 || back.Moved != 0 || !SamePlacement(next, back) {
				t.Errorf("undrained: err %v, change %+v, moved %d", err, ch, back.Moved)
			}
		})
	}

	// No room: three nodes drained whole leave 8 GPUs for 24 workers.
	tight := nodes
	for _, n := range nodes[1:] {
		tight = withNode(tight, n.ID, func(n *Node) { n.Out, n.Drained = true, []int{0, 1, 2, 3, 4, 5, 6, 7} })
	}
	deg, _, err := Replan(first, spec, tight)
	if deg.PlanState() != plan.StateDegraded || err == nil {
		t.Fatalf("three of four nodes drained: state %s, err %v", deg.PlanState(), err)
	}
	// Buffers of the drained nodes are unplaced too, following their
	// train workers (they keep their index for when the node returns).
	workersOut := 0
	for _, u := range deg.Unplaced {
		if u.Component == plan.Buffer {
			if u.NodeID == nodes[0].ID {
				t.Errorf("unplaced buffer %d last on %s, the node left in", u.Index, u.NodeID)
			}
			continue
		}
		workersOut++
		if !strings.HasPrefix(u.Reason, WhyDrained+" ") || u.NodeID == nodes[0].ID {
			t.Errorf("unplaced %s %d: reason %q, last on %s", u.Component, u.Index, u.Reason, u.NodeID)
		}
	}
	if workersOut != 16 {
		t.Errorf("%d workers unplaced, want 16", workersOut)
	}
	// Undrained, the unplaced workers return to their places.
	back, _, err := Replan(deg, spec, nodes)
	if err != nil || !back.Valid() {
		t.Fatalf("undrained: err %v", err)
	}
	for _, w := range back.Workers.All() {
		if o := first.Workers.Find(w.Component, w.Index); w.Component != plan.Buffer && !samePlace(o, w) {
			t.Errorf("%s %d back on %s%v, was on %s%v", w.Component, w.Index, w.NodeID, w.GPUs, o.NodeID, o.GPUs)
		}
	}
}
