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
func denseRef(nodes []Node, byID []idHold) holding {
	var out holding
	for i, n := range nodes {
		for _, x := range byID {
			if x.id == n.ID {
				out = append(out, hold{at: int32(i), gpus: x.gpus, resv: x.resv, cpus: x.cpus})
			}
		}
	}
	return out
}

func sameIDHold(a, b idHold) bool {
	return a.id == b.id && a.cpus == b.cpus && slices.Equal(a.gpus, b.gpus) && slices.Equal(a.resv, b.resv)
}

// scannedGPUs is HeldGPUs by its definition: each GPU of every worker
// and pool allocation, once.
func scannedGPUs(p *Plan) int {
	seen := map[string]bool{}
	EachHeldGPU(p, func(node string, g int) { seen[fmt.Sprint(node, "/", g)] = true })
	return len(seen)
}
