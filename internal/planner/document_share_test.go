package planner

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestPoolSharedWhenReReadAlike: a replan that reads a node of its pool
// again only for another plan's hold on a GPU it does not use renders
// that pool as before, so the plan shares the previous plan's entries
// and export for it; one that drops a worker there renders it anew. The
// document is the one rendered from scratch (a replan of the plan read
// back from JSON) either way.
func TestPoolSharedWhenReReadAlike(t *testing.T) {
	nodes := make([]Node, 4)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: 8}
	}
	spec := &Spec{
		Scheduling: Scheduling{
			Train: &WorkerGroup{WorkerNum: 8, NumCPUs: 1, NumGPUs: 1},
			Eval:  &WorkerGroup{WorkerNum: 12, Min: 1, Max: 32, NumCPUs: 1, NumGPUs: 1},
		},
		Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
	}
	prev, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	// Replanned once, so that its export gives worker_counts as every
	// replan's does and a replan of it can share its export entries.
	if prev, _, err = Replan(prev, spec, nodes); err != nil {
		t.Fatal(err)
	}
	rollout := func(p *Plan) (*plan.Pool, int) {
		for k := range p.Pools {
			if p.Pools[k].Name == RolloutPool {
				return &p.Pools[k], k
			}
		}
		t.Fatalf("no %s in %s", RolloutPool, placementOf(p))
		return nil, 0
	}
	pool, _ := rollout(prev)
	// The last node of the rollout pool: it hosts the highest eval
	// indices, and a GPU of it eval leaves free.
	last := pool.Nodes.At(pool.Nodes.Len() - 1)
	free := -1
	for g := range last.TotalGPUs {
		used := false
		for _, r := range last.Allocations[plan.Eval] {
			used = used || g >= r.First && g <= r.Last
		}
		for _, r := range last.Allocations[plan.Train] {
			used = used || g >= r.First && g <= r.Last
		}
		if !used && free < 0 {
			free = g
		}
	}
	if free < 0 {
		t.Fatalf("no free GPU on %s", last.NodeID)
	}
	for _, tc := range []struct {
		name  string
		eval  int
		share bool
	}{
		{"others' hold only", 12, true},
		{"a worker dropped there", 11, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := make([]Node, len(nodes))
			copy(after, nodes)
			for i := range after {
				if after[i].ID == last.NodeID {
					after[i].HeldBy = make([]string, after[i].GPUs)
					after[i].HeldBy[free] = "b"
				}
			}
			s := sized(spec, []int{tc.eval})
			doc, _, err := Replan(prev, s, after)
			if err != nil || doc.state == nil || doc.state.from != prev.state.token {
				t.Fatalf("replan: %v, want one from prev's state", err)
			}
			if len(doc.state.changedIDs()) == 0 {
				t.Fatal("the replan read no node again: nothing to check")
			}
			got, k := rollout(doc)
			shared := got.Nodes.Len() == pool.Nodes.Len() && len(got.Nodes.Chunks()) == len(pool.Nodes.Chunks()) && sameChunks(got.Nodes.Chunks(), pool.Nodes.Chunks())
			if shared != tc.share {
				t.Fatalf("rollout entries shared with prev's: %v, want %v", shared, tc.share)
			}
			_, pk := rollout(prev)
			if exp, err := json.Marshal(doc.ResourcePool[k]); err != nil || tc.share && string(exp) != string(docJSON(t, prev.ResourcePool[pk])) {
				t.Fatalf("export %s, want the previous plan's %s", exp, docJSON(t, prev.ResourcePool[pk]))
			}
			slow, _, err := Replan(readBackPlan(t, prev), s, after)
			if err != nil {
				t.Fatal(err)
			}
			if a, b := docJSON(t, doc.Pools), docJSON(t, slow.Pools); a != b {
				t.Fatalf("pools\n%s\nrendered from scratch\n%s", a, b)
			}
			if a, b := docJSON(t, doc.ResourcePool), docJSON(t, slow.ResourcePool); a != b {
				t.Fatalf("export\n%s\nrendered from scratch\n%s", a, b)
			}
		})
	}
}

func docJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readBackPlan is p written as JSON and read back: no run state.
func readBackPlan(t *testing.T, p *Plan) *Plan {
	t.Helper()
	var q Plan
	if err := json.Unmarshal([]byte(docJSON(t, p)), &q); err != nil {
		t.Fatal(err)
	}
	return &q
}
