package planner

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestHeldKeptMatchesScan: however the nodes change under a run of
// replans (nodes leaving and joining, GPUs turning unhealthy, one or two
// plans sharing the cluster), the holding kept with each plan, patched
// from its previous plan's where the run started from it, is what
// reading every worker and pool of the plan says, and so is HeldGPUs.
func TestHeldKeptMatchesScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(4, 24).Draw(t, "nodes")
		nodes := make([]Node, n)
		for i := range nodes {
			nodes[i] = Node{ID: fmt.Sprintf("n%02d", i), IP: "10.0.0.1", CPUs: 64, GPUs: 8}
		}
		var jobs []Job
		for j := range rapid.IntRange(1, 2).Draw(t, "plans") {
			gpus := 8 * n / 4
			jobs = append(jobs, Job{Name: fmt.Sprintf("p%d", j), Age: uint64(j), Spec: &Spec{
				Scheduling: Scheduling{
					Train:  &WorkerGroup{WorkerNum: rapid.IntRange(1, gpus/2).Draw(t, "train"), NumCPUs: 1, NumGPUs: 1},
					Buffer: &WorkerGroup{Auto: true, NumCPUs: 1},
					Env:    []WorkerGroup{{WorkerNum: rapid.IntRange(0, gpus).Draw(t, "env"), NumGPUs: 0.25}},
				},
				Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
				Priority:  rapid.IntRange(0, 1).Draw(t, "priority"),
			}})
		}
		next := n
		for step := range rapid.IntRange(1, 8).Draw(t, "steps") {
			for j, o := range PlanAll(jobs, nodes) {
				jobs[j].Prev = o.Plan
				if !o.Plan.Placed() || o.Plan.state == nil {
					continue
				}
				kept := o.Plan.state.held.Load()
				if kept == nil {
					t.Fatalf("step %d: plan %s: no holding kept", step, jobs[j].Name)
				}
				want := scanHeld(o.Plan)
				if !slices.EqualFunc(*kept, want, sameIDHold) {
					t.Fatalf("step %d: plan %s: kept holding\n%v\nread afresh\n%v", step, jobs[j].Name, *kept, want)
				}
				if got, want := newAllocator(jobs, nodes).holdingOf(o.Plan), denseRef(nodes, want); !got.equal(want) {
					t.Fatalf("step %d: plan %s: holding by position\n%v\nwant\n%v", step, jobs[j].Name, got, want)
				}
				if got, want := HeldGPUs(o.Plan), scannedGPUs(o.Plan); got != want {
					t.Fatalf("step %d: plan %s: HeldGPUs %d, counted %d", step, jobs[j].Name, got, want)
				}
			}
			switch i := rapid.IntRange(0, len(nodes)-1).Draw(t, "node"); rapid.IntRange(0, 3).Draw(t, "change") {
			case 0:
				if len(nodes) > 1 {
					nodes = slices.Delete(slices.Clone(nodes), i, i+1)
				}
			case 1:
				nodes = append(slices.Clone(nodes), Node{ID: fmt.Sprintf("n%02d", next), IP: "10.0.0.1", CPUs: 64, GPUs: 8})
				next++
			case 2:
				nodes = slices.Clone(nodes)
				nodes[i].Unhealthy = append(slices.Clone(nodes[i].Unhealthy), rapid.IntRange(0, 7).Draw(t, "gpu"))
			default:
				// Out of id order: positions found by id, not by a merge.
				nodes = slices.Clone(nodes)
				nodes[0], nodes[i] = nodes[i], nodes[0]
			}
		}
	})
}

// denseRef is a holding by id as positions in nodes, by a plain search.
func denseRef(nodes []Node, byID []*idHold) holding {
	var out holding
	for i, n := range nodes {
		for _, x := range byID {
			if x.id == n.ID {
				out = append(out, hold{at: int32(i), idHold: &idHold{gpus: x.gpus, resv: x.resv, cpus: x.cpus}})
			}
		}
	}
	return out
}

// scannedGPUs is HeldGPUs by its definition: each GPU of every worker
// and pool allocation, once.
func scannedGPUs(p *Plan) int {
	seen := map[string]bool{}
	EachHeldGPU(p, func(node string, g int) { seen[fmt.Sprint(node, "/", g)] = true })
	return len(seen)
}

// TestPatchHeldSharesUnchanged: a replan that reads a node again only
// for another plan's hold on a GPU its plan does not use (a shrink's
// taker beside it) holds what the plan before it held: the holding by
// id is the previous plan's, shared, and so is the holding by position
// (the allocator's); one whose workers changed there gets a holding of
// its own, read again.
func TestPatchHeldSharesUnchanged(t *testing.T) {
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
	base := heldOf(prev)
	// A node prev uses in part, and a GPU of it prev leaves free.
	at, free := -1, -1
	for i := range nodes {
		for g := range nodes[i].GPUs {
			if !slices.ContainsFunc(base, func(h *idHold) bool { return h.id == nodes[i].ID && slices.Contains(h.gpus, g) }) &&
				slices.ContainsFunc(base, func(h *idHold) bool { return h.id == nodes[i].ID }) && at < 0 {
				at, free = i, g
			}
		}
	}
	if at < 0 {
		t.Fatal("no node used in part")
	}
	for _, tc := range []struct {
		name  string
		spec  *Spec
		share bool
	}{
		{"others' hold only", spec, true},
		// One eval worker fewer: the run re-reads the node whose worker
		// it drops.
		{"its own workers changed", sized(spec, []int{11}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := slices.Clone(nodes)
			after[at].HeldBy = make([]string, after[at].GPUs)
			after[at].HeldBy[free] = "b"
			s := tc.spec
			doc, _, err := Replan(prev, s, after)
			if err != nil || doc.state == nil || doc.state.from != prev.state.token {
				t.Fatalf("replan: %v, want one from prev's state", err)
			}
			if len(doc.state.changedIDs()) == 0 {
				t.Fatal("the replan read no node again: nothing to check")
			}
			a := newAllocator([]Job{{Name: "a", Spec: s, Prev: prev}}, after)
			before := a.holdingOf(prev)
			got := a.byID(doc)
			if !slices.EqualFunc(got, scanHeld(doc), sameIDHold) {
				t.Fatalf("holding %v, read %v", got, scanHeld(doc))
			}
			dense := a.holdingOf(doc)
			if !dense.equal(a.dense(scanHeld(doc))) {
				t.Fatalf("dense holding %v, want %v", dense, a.dense(scanHeld(doc)))
			}
			shared := &got[0] == &base[0] && &dense[0] == &before[0]
			if shared != tc.share {
				t.Fatalf("holdings shared with prev's: %v, want %v", shared, tc.share)
			}
		})
	}
}

// TestDenseFactsShared: a kept dense holding that one allocator of a
// PlanAll checked on its nodes is taken as it is by another on the very
// same nodes, and is what dense(byID) gives; an allocator on other nodes
// (a copy with two ids swapped, or the same nodes cut short) does not
// take it from those facts and gets what an allocator with none gets.
func TestDenseFactsShared(t *testing.T) {
	nodes := make([]Node, 12)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("n%02d", i), IP: "10.0.0.1", CPUs: 64, GPUs: 8}
	}
	spec := &Spec{Scheduling: Scheduling{Train: &WorkerGroup{WorkerNum: 40, NumCPUs: 1, NumGPUs: 1}},
		Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}
	p, err := Compute(spec, nodes)
	if err != nil || p.state == nil {
		t.Fatalf("compute: %v", err)
	}
	facts := &nodeFacts{nodes: nodes}
	swapped := slices.Clone(nodes)
	swapped[2].ID, swapped[9].ID = swapped[9].ID, swapped[2].ID
	for _, tc := range []struct {
		name  string
		nodes []Node
	}{
		{"same nodes", nodes},
		{"ids swapped", swapped},
		{"cut short", nodes[:8]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := newAllocator(nil, nodes)
			first.facts = facts
			first.denseOf(p) // checks, keeps and records p's holding on nodes
			shared := newAllocator(nil, tc.nodes)
			shared.facts = facts
			alone := newAllocator(nil, tc.nodes)
			got, want := shared.denseOf(p), alone.denseOf(p)
			if !slices.EqualFunc(got, want, func(x, y hold) bool {
				return x.at == y.at && slices.Equal(x.gpus, y.gpus) && x.cpus == y.cpus
			}) {
				t.Fatalf("with shared facts %v, alone %v", got, want)
			}
			if fresh := alone.dense(alone.byID(p)); !slices.EqualFunc(got, fresh, func(x, y hold) bool { return x.at == y.at }) {
				t.Fatalf("with shared facts %v, dense %v", got, fresh)
			}
		})
	}
}
