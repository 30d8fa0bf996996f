package planner

import (
	"fmt"
	"slices"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
	"pgregory.net/rapid"
)

// TestPoolChunksMatchStates: on pools of several chunks (600 to 1,200
// nodes), an elastic plan grown, shrunk for plans of higher priority,
// and replanned after nodes leave and return lists in every pool entry
// what its node's state renders now (the entry the state keeps), whether
// the entry's chunk was the previous plan's (renderPool shares a chunk
// whose every entry is as before) or rendered again; and some chunks are
// shared, so that the check reads shared ones.
func TestPoolChunksMatchStates(t *testing.T) {
	shared := 0
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(600, 1200).Draw(t, "nodes")
		all := make([]Node, n)
		for i := range all {
			all[i] = Node{ID: fmt.Sprintf("n%04d", i), IP: "10.0.0.1", CPUs: 64, GPUs: 8}
		}
		gpus := 8 * n
		lo := rapid.IntRange(1, gpus/4).Draw(t, "evalMin")
		a := Job{Name: "a", Age: 1, Spec: &Spec{
			Scheduling: Scheduling{
				Train: &WorkerGroup{WorkerNum: rapid.IntRange(1, gpus/4).Draw(t, "train"), NumCPUs: 1, NumGPUs: 1},
				Eval:  &WorkerGroup{WorkerNum: lo, Min: lo, Max: gpus, NumCPUs: 1, NumGPUs: 1},
			},
			Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
		}}
		jobs, nodes, age := []Job{a}, all, uint64(1)
		for range rapid.IntRange(2, 6).Draw(t, "steps") {
			switch rapid.IntRange(0, 3).Draw(t, "change") {
			case 0: // a plan of higher priority: a shrinks for it
				age++
				jobs = append(jobs, Job{Name: fmt.Sprintf("t%d", age), Age: age, Spec: &Spec{Priority: 10,
					Scheduling: Scheduling{Train: &WorkerGroup{WorkerNum: rapid.IntRange(1, 64).Draw(t, "taker"), NumCPUs: 1, NumGPUs: 1}},
					Placement:  Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}})
			case 1: // one leaves: a grows back
				if len(jobs) > 1 {
					jobs = slices.Delete(slices.Clone(jobs), 1, 2)
				}
			case 2: // a node leaves
				i := rapid.IntRange(0, len(nodes)-1).Draw(t, "lost")
				nodes = slices.Delete(slices.Clone(nodes), i, i+1)
			default: // every node is back
				nodes = all
			}
			outs := PlanAll(jobs, nodes)
			for k, o := range outs {
				if o.Plan == nil || o.Plan.state == nil {
					continue
				}
				shared += checkPoolChunks(t, o.Plan, jobs[k].Prev)
				jobs[k].Prev = o.Plan
			}
		}
	})
	if shared == 0 {
		t.Fatal("no pool chunk was shared with the plan before: the check read none")
	}
}

// checkPoolChunks checks every auto pool entry of p against its node's
// state's entry, and returns how many of p's chunks prev's pools had.
func checkPoolChunks(t *rapid.T, p, prev *Plan) int {
	st := p.state
	shared := 0
	for auto := range st.rendered {
		rendered, order := st.rendered[auto], st.order[auto]
		if rendered.Len() == 0 {
			continue
		}
		if rendered.Len() != len(order) {
			t.Fatalf("pool %d: %d entries for %d nodes", auto, rendered.Len(), len(order))
		}
		for i, got := range rendered.All() {
			want := st.table[order[i]].doc(auto)
			if want == nil {
				t.Fatalf("pool %d entry %d (%s): its state keeps no entry", auto, i, got.NodeID)
			}
			if !samePoolNode(*got, *want) || (got.Allocations == nil) != (want.Allocations == nil) {
				t.Fatalf("pool %d entry %d: %+v, its state renders %+v", auto, i, *got, *want)
			}
		}
		if prev == nil || prev.state == nil {
			continue
		}
		for _, c := range rendered.Chunks() {
			for _, was := range prev.state.rendered {
				if slices.ContainsFunc(was.Chunks(), func(w []plan.PoolNode) bool { return len(w) > 0 && &w[0] == &c[0] }) {
					shared++
				}
			}
		}
	}
	return shared
}
