package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// exampleSpec reads a spec of examples/.
func exampleSpec(t *testing.T, name string) *Spec {
	t.Helper()
	data, err := os.ReadFile("../../examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return mustSpec(t, string(data))
}

// replanAll runs PlanAll on jobs, each from its previous outcome (prev,
// by name), and returns the outcomes by name, checking that no GPU
// serves two jobs and that each plan holds its invariants.
func replanAll(t *testing.T, jobs []Job, prev map[string]Outcome, nodes []Node) map[string]Outcome {
	t.Helper()
	for i := range jobs {
		if o, ok := prev[jobs[i].Name]; ok {
			jobs[i].Prev = o.Plan
		}
	}
	out := planAll(t, jobs, nodes)
	for _, j := range jobs {
		o := out[j.Name]
		var degraded *DegradedError
		if o.Plan.PlanState() != o.Plan.PlanState() || (o.Plan.PlanState() == plan.StateDegraded) != errors.As(o.Err, &degraded) {
			t.Fatalf("%s: state %q, valid %v, error %v", j.Name, o.Plan.PlanState(), o.Plan.Valid(), o.Err)
		}
		if o.Plan.Placed() && o.Plan.spec != nil { // nil: held as it was read
			if errs := checkPlan(o.Plan.spec, nodes, o.Plan); len(errs) > 0 {
				t.Fatalf("%s: %v", j.Name, errs)
			}
			if o.Plan.GPUsHeld != HeldGPUs(o.Plan) {
				t.Fatalf("%s: gpus_held %d, holds %d", j.Name, o.Plan.GPUsHeld, HeldGPUs(o.Plan))
			}
		}
	}
	return out
}

// flapJobs are the cluster: the quick start's plan (24 GPUs) and
// an experiment (8 GPUs, the same priority) on four nodes of 8 GPUs.
func flapJobs(t *testing.T) ([]Node, []Job) {
	return uniformNodes(4, 8, 224), []Job{
		{Name: "default", Spec: exampleSpec(t, "disaggregate.yaml"), Age: 1},
		{Name: "exp", Spec: exampleSpec(t, "experiment.yaml"), Age: 2},
	}
}

// TestDegradedNodeFlap: the case. A node of the quick start's
// plan leaves while the other plan holds the rest: the plan is degraded,
// not released: every worker elsewhere stays, the node's workers are
// listed unplaced where they ran, its GPUs stay its own. The node
// returns: exactly those workers go back, on the same GPUs, and nothing
// else moves. Also when the degraded revision was read back from JSON
// (a planner restarted in between).
func TestDegradedNodeFlap(t *testing.T) {
	nodes, jobs := flapJobs(t)
	first := replanAll(t, jobs, nil, nodes)
	if !first["default"].Plan.Valid() || !first["exp"].Plan.Valid() {
		t.Fatalf("setup: %v %v", first["default"].Err, first["exp"].Err)
	}
	for _, gone := range []string{"n1", "n2", "n3"} {
		for _, readBack := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s json %v", gone, readBack), func(t *testing.T) {
				on := workersOn(first["default"].Plan, gone) // buffers too
				if len(on) == 0 {
					t.Skipf("default has no worker on %s", gone)
				}
				if workersOn(first["exp"].Plan, gone) != nil && len(workersOn(first["exp"].Plan, gone)) > 0 {
					t.Skipf("exp is on %s too", gone)
				}
				out := replanAll(t, jobs, first, without(nodes, gone))
				d := out["default"].Plan
				if d.Valid() || d.PlanState() != plan.StateDegraded || !d.Placed() {
					t.Fatalf("default after %s left: valid %v, state %q: %s", gone, d.Valid(), d.PlanState(), d.Error)
				}
				if !strings.HasPrefix(d.Error, "degraded: ") || !strings.Contains(d.Error, "node left "+gone) {
					t.Errorf("error %q", d.Error)
				}
				if !SamePlacement(first["exp"].Plan, out["exp"].Plan) {
					t.Errorf("exp changed")
				}
				// Every worker elsewhere kept, buffers at their indices; the
				// node's listed, where they ran, its buffer too.
				for _, w := range first["default"].Plan.Workers.All() {
					now := d.Workers.Find(w.Component, w.Index)
					switch {
					case w.NodeID != gone && (now == nil || !samePlace(w, now)):
						t.Fatalf("%s %d moved from %s", w.Component, w.Index, w.NodeID)
					case w.NodeID == gone:
						u := unplacedOf(d, w.Component, w.Index)
						if u == nil || now != nil || u.NodeID != gone || !slices.Equal(u.GPUs, w.GPUs) ||
							!slices.Equal(u.GPUUUIDs, w.GPUUUIDs) || u.Reason != WhyNodeLeft+" "+gone {
							t.Fatalf("%s %d of %s: unplaced %+v, placed %v", w.Component, w.Index, gone, u, now)
						}
					}
				}
				if len(d.Unplaced) != len(on) || d.Moved != 0 || len(out["default"].Change.Unplaced) != len(on) {
					t.Errorf("%d unplaced, %d were on %s; moved %d; change %s", len(d.Unplaced), len(on), gone, d.Moved, out["default"].Change.Summary())
				}
				// Replanned again on the same: the same revision (no news).
				again := replanAll(t, jobs, out, without(nodes, gone))
				if !SamePlacement(d, again["default"].Plan) {
					t.Fatalf("replanned on the same inventory, the degraded plan changed: %s", again["default"].Plan.Error)
				}
				if readBack {
					b, _ := json.Marshal(d)
					var p Plan
					if err := json.Unmarshal(b, &p); err != nil {
						t.Fatal(err)
					}
					o := out["default"]
					o.Plan = &p
					out["default"] = o
				}
				back := replanAll(t, jobs, out, nodes)
				if b := back["default"].Plan; !b.Valid() || len(b.Unplaced) != 0 || !sameWorkers(first["default"].Plan, b) || b.Moved != len(on) {
					t.Fatalf("the node is back: valid %v, %d unplaced, moved %d (%d were on it): %s", b.Valid(), len(b.Unplaced), b.Moved, len(on), back["default"].Change.Summary())
				}
				for _, w := range back["default"].Plan.Workers.All() {
					if was := first["default"].Plan.Workers.Find(w.Component, w.Index); was == nil || !samePlace(was, w) || !slices.Equal(was.GPUUUIDs, w.GPUUUIDs) {
						t.Fatalf("%s %d back on %s %v, was on %+v", w.Component, w.Index, w.NodeID, w.GPUUUIDs, was)
					}
				}
				if !maps.EqualFunc(first["default"].Plan.StorageToTrainWorkers, back["default"].Plan.StorageToTrainWorkers, slices.Equal) {
					t.Fatalf("buffers serve %v, served %v", back["default"].Plan.StorageToTrainWorkers, first["default"].Plan.StorageToTrainWorkers)
				}
				if !SamePlacement(first["exp"].Plan, back["exp"].Plan) {
					t.Errorf("exp changed")
				}
			})
		}
	}
}

// TestDegradedKeepsItsGPUs: a degraded plan's GPUs, and those its
// unplaced workers ran on, are its own against plans of its priority:
// one arriving that would fit in them waits, older or younger, and when
// the node returns the degraded plan's workers go back there.
func TestDegradedKeepsItsGPUs(t *testing.T) {
	nodes := uniformNodes(2, 8, 64)
	a := Job{Name: "a", Spec: trainSpec(t, 16, 0, 0), Age: 5}
	first := replanAll(t, []Job{a}, nil, nodes)
	gone := without(nodes, "n2")
	deg := replanAll(t, []Job{a}, first, gone)
	if deg["a"].Plan.PlanState() != plan.StateDegraded || deg["a"].Plan.Workers.Len() != 8 || len(deg["a"].Plan.Unplaced) != 8 {
		t.Fatalf("a: %s, %d workers", deg["a"].Plan.PlanState(), deg["a"].Plan.Workers.Len())
	}
	for _, age := range []uint64{1, 9} { // older and younger
		t.Run(fmt.Sprintf("age %d", age), func(t *testing.T) {
			b := Job{Name: "b", Spec: trainSpec(t, 4, 0, 0), Age: age}
			out := replanAll(t, []Job{a, b}, deg, gone)
			if !SamePlacement(deg["a"].Plan, out["a"].Plan) || out["b"].Plan.Placed() {
				t.Fatalf("a kept %v; b %s", SamePlacement(deg["a"].Plan, out["a"].Plan), out["b"].Plan.PlanState())
			}
			if e := out["b"].Plan.Error; !strings.HasPrefix(e, "waits for room held by plan a (priority 0): ") {
				t.Fatalf("b's error %q", e)
			}
			// The node comes back: a's workers go back to it; b takes none
			// of their GPUs, and waits still (16 of 16 are a's).
			back := replanAll(t, []Job{a, b}, out, nodes)
			if p := back["a"].Plan; !p.Valid() || !sameWorkers(first["a"].Plan, p) || back["b"].Plan.Placed() {
				t.Fatalf("a back: valid %v, same %v; b %s", p.Valid(), sameWorkers(first["a"].Plan, p), back["b"].Plan.PlanState())
			}
		})
	}
}

// TestDegradedPreempted: a plan of higher priority may still take a
// degraded plan's GPUs; the degraded plan is then released, as any plan
// that gives way, and says by whom.
func TestDegradedPreempted(t *testing.T) {
	nodes := uniformNodes(3, 8, 64)
	a := Job{Name: "a", Spec: trainSpec(t, 16, 0, 0), Age: 1}
	first := replanAll(t, []Job{a}, nil, nodes[:2])
	deg := replanAll(t, []Job{a}, first, nodes[:1])
	if deg["a"].Plan.PlanState() != plan.StateDegraded {
		t.Fatalf("a: %s", deg["a"].Plan.PlanState())
	}
	high := Job{Name: "high", Spec: trainSpec(t, 6, 5, 0), Age: 2}
	out := replanAll(t, []Job{a, high}, deg, nodes[:1])
	// Released, and told why: with high gone it would not fit either
	// (16 GPUs on 8), so not "preempted by" but its own reason.
	if p := out["a"].Plan; p.Placed() || !slices.Equal(p.PreemptedBy, []string{"high"}) || p.Error != "Insufficient GPUs: required 16.0, available 2" {
		t.Fatalf("a: %s, preempted by %v: %s", p.PlanState(), p.PreemptedBy, p.Error)
	}
	// With room elsewhere (n3 joins) high takes that: a keeps its workers
	// and places two of the unplaced on what high leaves.
	out = replanAll(t, []Job{a, high}, deg, []Node{nodes[0], nodes[2]})
	if p := out["a"].Plan; p.PlanState() != plan.StateDegraded || !keptWorkers(deg["a"].Plan, p) || p.Workers.Len() != 10 || len(p.PreemptedBy) != 0 {
		t.Fatalf("a beside high: %s, %d workers: %s", p.PlanState(), p.Workers.Len(), p.Error)
	}
}

// TestDegradedFaults: each fault that leaves a full plan without room
// degrades it, lists the worker with why and where it ran, and the
// worker goes back there once the fault is gone.
func TestDegradedFaults(t *testing.T) {
	nodes := uniformNodes(2, 4, 16)
	spec := mustSpec(t, "scheduling: {train: {worker_num: 8, num_cpus: 2, num_gpus: 1}}\n")
	first, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		fault  func(*Node)
		reason string
		count  int
	}{
		{"GPU unhealthy", func(n *Node) { n.Unhealthy = []int{2} }, WhyUnhealthy + " n2:2", 1},
		{"GPU gone", func(n *Node) { n.GPUs, n.GPUUUIDs = 3, n.GPUUUIDs[:3] }, WhyGPUGone + " n2:3", 1},
		{"CPUs shrank", func(n *Node) { n.CPUs = 4 }, WhyCPUs + " n2", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			faulty := withNode(nodes, "n2", c.fault)
			p, ch, err := Replan(first, spec, faulty)
			var degraded *DegradedError
			if !errors.As(err, &degraded) || p.PlanState() != plan.StateDegraded || len(p.Unplaced) != c.count || degraded.Unplaced != c.count {
				t.Fatalf("err %v, state %q, %d unplaced", err, p.PlanState(), len(p.Unplaced))
			}
			for _, u := range p.Unplaced {
				was := first.Workers.Find(u.Component, u.Index)
				if u.Reason != c.reason && !strings.HasPrefix(u.Reason, strings.Fields(c.reason)[0]) || u.NodeID != was.NodeID || !slices.Equal(u.GPUs, was.GPUs) {
					t.Errorf("unplaced %+v, want %q where %s %v", u, c.reason, was.NodeID, was.GPUs)
				}
			}
			if errs := checkPlan(spec, faulty, p); len(errs) > 0 || !keptWorkers(p, first) || ch.Fresh {
				t.Fatalf("degraded plan: %v; kept %v", errs, keptWorkers(p, first))
			}
			if !strings.Contains(p.Error, "Insufficient") && !strings.Contains(p.Error, "Cannot place") {
				t.Errorf("error %q", p.Error)
			}
			healed, _, err := Replan(p, spec, nodes)
			if err != nil || !sameWorkers(first, healed) || healed.Moved != c.count {
				t.Fatalf("healed: %v, same %v, moved %d", err, sameWorkers(first, healed), healed.Moved)
			}
		})
	}
}

// TestDegradedManual: a manual pool whose node leaves keeps its other
// nodes' workers; the export lists what is placed, and loads back to
// it; the node's return restores the plan.
func TestDegradedManual(t *testing.T) {
	nodes := uniformNodes(2, 4, 16)
	spec := mustSpec(t, `
scheduling:
  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}
  env: [{worker_num: 8, num_cpus: 1, num_gpus: 0.5}]
placement: {mode: manual}
resource_pool:
  - {name: train_pool, num_node: 1, num_gpus: 4, node_ids: [n1], train: "0-3"}
  - {name: rollout_pool, num_node: 1, num_gpus: 4, node_ids: [n2], env: "0-3"}
`)
	first, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := Replan(first, spec, without(nodes, "n2"))
	if p.PlanState() != plan.StateDegraded || p.Workers.Len() != 4 || len(p.Unplaced) != 8 {
		t.Fatalf("%v: %s, %d workers, %d unplaced", err, p.PlanState(), p.Workers.Len(), len(p.Unplaced))
	}
	if errs := checkPlan(spec, without(nodes, "n2"), p); len(errs) > 0 {
		t.Fatal(errs)
	}
	if !strings.Contains(p.Error, `node_ids[0]: node "n2" is not in the inventory`) {
		t.Errorf("error %q", p.Error)
	}
	back, _, err := Replan(p, spec, nodes)
	if err != nil || !sameWorkers(first, back) {
		t.Fatalf("n2 back: %v", err)
	}
}

// pendingJobs are a (8 GPUs) and b (8 GPUs) of one priority on two
// nodes of 8, placed.
func pendingJobs(t *testing.T) ([]Node, []Job, map[string]Outcome) {
	nodes := shareNodes(2)
	jobs := []Job{{Name: "a", Spec: trainSpec(t, 8, 0, 0), Age: 1}, {Name: "b", Spec: trainSpec(t, 8, 0, 0), Age: 2}}
	return nodes, jobs, replanAll(t, jobs, nil, nodes)
}

// TestPendingSpec: a new spec that cannot be placed leaves the plan's
// placement in force, on the spec it follows, and says why the new one
// waits; the plan moves to it as soon as it fits. A spec with an error
// of its own releases nothing either.
func TestPendingSpec(t *testing.T) {
	nodes, jobs, first := pendingJobs(t)
	for _, c := range []struct {
		name   string
		spec   *Spec
		reason string
	}{
		{"too big beside b", trainSpec(t, 12, 0, 0), "waits for room held by plan b (priority 0): Insufficient GPUs: required 12.0, available 8"},
		{"too big for the cluster", trainSpec(t, 20, 0, 0), "Insufficient GPUs: required 20.0, available 8"},
		{"over its quota", trainSpec(t, 8, 0, 4), "max_gpus: the plan needs 8 GPUs; its quota is 4"},
		{"an error of its own", specT(t, `
scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1}}
placement: {mode: manual}
resource_pool: [{name: train_pool, num_node: 1, num_gpus: 8, node_ids: [n7], train: "0-7"}]
`), `resource_pool[0].node_ids[0]: node "n7" is not in the inventory`},
	} {
		t.Run(c.name, func(t *testing.T) {
			jobs := slices.Clone(jobs)
			jobs[0].Spec = c.spec
			out := replanAll(t, jobs, first, nodes)
			p := out["a"].Plan
			if !p.Valid() || out["a"].Err != nil || p.PendingSpec == nil || p.PendingSpec.Reason != c.reason {
				t.Fatalf("a: valid %v (%v), pending %+v; want %q", p.Valid(), out["a"].Err, p.PendingSpec, c.reason)
			}
			if !sameWorkers(first["a"].Plan, p) || !slices.Equal(p.Demands, first["a"].Plan.Demands) || p.Moved != 0 {
				t.Fatalf("a's placement changed")
			}
			// Still pending on the next replan, from memory or (with
			// PrevSpec) from JSON: no news.
			again := replanAll(t, jobs, out, nodes)
			if !SamePlacement(p, again["a"].Plan) {
				t.Fatalf("pending again: %v", again["a"].Plan.PendingSpec)
			}
			b, _ := json.Marshal(p)
			var read Plan
			if err := json.Unmarshal(b, &read); err != nil {
				t.Fatal(err)
			}
			jobs[0].PrevSpec = first["a"].Plan.spec
			fromJSON := replanAll(t, jobs, map[string]Outcome{"a": {Plan: &read}, "b": out["b"]}, nodes)
			if !SamePlacement(p, fromJSON["a"].Plan) {
				t.Fatalf("pending from JSON: %v", fromJSON["a"].Plan.PendingSpec)
			}
			// Without PrevSpec the spec it follows is not known: held as
			// it is, pending still.
			jobs[0].PrevSpec = nil
			held := replanAll(t, jobs, map[string]Outcome{"a": {Plan: &read}, "b": out["b"]}, nodes)
			if !SamePlacement(p, held["a"].Plan) {
				t.Fatalf("pending from JSON, spec not known: %s, %v", held["a"].Plan.PlanState(), held["a"].Plan.PendingSpec)
			}
			// A node leaves meanwhile: the kept placement degrades, pending.
			deg := replanAll(t, jobs, out, without(nodes, "n1"))
			if d := deg["a"].Plan; d.PendingSpec == nil || d.Valid() && len(workersOn(p, "n1")) > 0 || !d.Placed() {
				t.Fatalf("a with n1 gone: %s, pending %v", d.PlanState(), d.PendingSpec)
			}
		})
	}
	// b leaves: a moves to its new spec, keeping its workers.
	jobs[0].Spec = trainSpec(t, 12, 0, 0)
	out := replanAll(t, jobs, first, nodes)
	moved := replanAll(t, jobs[:1], out, nodes)
	if p := moved["a"].Plan; !p.Valid() || p.PendingSpec != nil || p.Workers.Len() != 12 || !keptWorkers(first["a"].Plan, p) {
		t.Fatalf("a on its new spec: %v, pending %v, %d workers", moved["a"].Err, p.PendingSpec, p.Workers.Len())
	}
}

// TestPendingNeverPlaced: a plan that never had a placement has nothing
// to keep: its new spec's error is its own, as before.
func TestPendingNeverPlaced(t *testing.T) {
	nodes, low, high := preempted(t)
	low.Spec = trainSpec(t, 6, 0, 0)
	got := planAll(t, []Job{low, high}, nodes)["low"].Plan
	if got.Placed() || got.PendingSpec != nil {
		t.Fatalf("low: %s, pending %v", got.PlanState(), got.PendingSpec)
	}
}

// TestReasonsYouCanAct: a plan waits for room held by the plans that,
// giving way, would make room; where none would, its reason is its own;
// a node whose healthy GPUs other plans hold says so, never that it has
// no (or too few) healthy GPUs.
func TestReasonsYouCanAct(t *testing.T) {
	nodes := shareNodes(3) // 24 GPUs
	big := Job{Name: "big", Spec: trainSpec(t, 16, 0, 0), Age: 1}
	small := Job{Name: "small", Spec: trainSpec(t, 4, 0, 0), Age: 2}
	placed := replanAll(t, []Job{big, small}, nil, nodes)
	for _, c := range []struct {
		spec *Spec
		want string
	}{
		// 4 free: with small gone 8, too few; with big gone 20.
		{trainSpec(t, 12, 0, 0), "waits for room held by plan big (priority 0): Insufficient GPUs: required 12.0, available 4"},
		// 4 free: with either gone enough.
		{trainSpec(t, 8, 0, 0), "waits for room held by plan big (priority 0), plan small (priority 0): Insufficient GPUs: required 8.0, available 4"},
		// More than the cluster: its own reason.
		{trainSpec(t, 30, 0, 0), "Insufficient GPUs: required 30.0, available 4"},
	} {
		newer := Job{Name: "newer", Spec: c.spec, Age: 3}
		out := replanAll(t, []Job{big, small, newer}, placed, nodes)
		if e := out["newer"].Plan.Error; e != c.want {
			t.Errorf("newer of %d: %q, want %q", c.spec.Scheduling.Train.WorkerNum, e, c.want)
		}
	}
	// A worker of 4 GPUs where 2 are free on n1 and n2 each: every node
	// has 8 healthy GPUs; what stops it is the plans that hold them.
	big.Spec, small.Spec = trainSpec(t, 14, 0, 0), trainSpec(t, 6, 0, 0)
	placed = replanAll(t, []Job{big, small}, nil, nodes)
	wide := Job{Name: "wide", Spec: mustSpec(t, "scheduling: {eval: {worker_num: 1, num_cpus: 1, num_gpus: 4}}\n"), Age: 3}
	out := replanAll(t, []Job{big, small, wide}, placed, nodes)
	p := out["wide"].Plan
	x := explanationOf(p, plan.Eval)
	if x == nil {
		t.Fatalf("no explanation: %s", p.Error)
	}
	for _, r := range x.Excluded {
		if r.Reason == ReasonNoHealthyGPUs || r.Reason == TooFewGPUs(4) {
			t.Errorf("wide: %s, though every GPU is healthy", r)
		}
	}
	if !strings.Contains(fmt.Sprint(x.Excluded), ReasonHeldBy+"big") {
		t.Errorf("wide's reasons %v name no holder", x.Excluded)
	}
}

// TestDegradedText: planner plan's text says a plan is degraded, lists
// its unplaced workers with where they ran, and says a spec is pending.
func TestDegradedText(t *testing.T) {
	nodes := uniformNodes(2, 4, 16)
	spec := mustSpec(t, "scheduling: {train: {worker_num: 8, num_cpus: 1, num_gpus: 1}}\n")
	first, _ := Compute(spec, nodes)
	p, _, _ := Replan(first, spec, without(nodes, "n2"))
	p.PendingSpec = &plan.PendingSpec{Reason: "Insufficient GPUs: required 12.0, available 8"}
	var b strings.Builder
	if err := WriteText(&b, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DEGRADED (4 workers unplaced)", "degraded: 4 workers unplaced (train 4-7: node left n2)",
		"train 4-7: node left n2 (last on n2)", "pending spec (this placement is the last spec's): Insufficient GPUs"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
}

// TestDegradedUpgraded: a degraded revision from before typed statuses
// (no status, the same words) is news once, so that its successor
// carries why; from then on the plan stays put.
func TestDegradedUpgraded(t *testing.T) {
	nodes, jobs := flapJobs(t)
	first := replanAll(t, jobs, nil, nodes)
	var gone string
	for _, n := range []string{"n1", "n2", "n3"} {
		if len(workersOn(first["default"].Plan, n)) > 0 && len(workersOn(first["exp"].Plan, n)) == 0 {
			gone = n
			break
		}
	}
	if gone == "" {
		t.Skip("default shares every node with exp")
	}
	left := without(nodes, gone)
	out := replanAll(t, jobs, first, left)
	d := out["default"].Plan
	if d.PlanState() != plan.StateDegraded || d.Status.State != plan.StateDegraded {
		t.Fatalf("setup: state %q, status %+v", d.PlanState(), d.Status)
	}
	if again := replanAll(t, jobs, out, left)["default"].Plan; !SamePlacement(d, again) {
		t.Fatalf("degraded plan not put: %q then %q", d.Error, again.Error)
	}
	old := *d
	old.Status = plan.Status{State: plan.StateDegraded} // as a document an older planner wrote reads
	out["default"] = Outcome{Plan: &old}
	next := replanAll(t, jobs, out, left)
	got := next["default"].Plan
	if got.Status.Reason == "" || SamePlacement(&old, got) {
		t.Fatalf("after the upgrade: status %+v, no news %v", got.Status, SamePlacement(&old, got))
	}
	if again := replanAll(t, jobs, next, left)["default"].Plan; !SamePlacement(got, again) {
		t.Fatalf("not put after the upgrade: %+v then %+v", got.Status, again.Status)
	}
}

// TestBufferFlap: on four nodes each hosting train, each with its buffer,
// one node leaves and comes back. The degraded plan keeps every other
// buffer at its index on its node and lists the node's own unplaced,
// where it ran; once the node is back, every buffer is where it was and
// serves the train workers it served (numbered densely, buffers would
// shift down while the node was gone and back up after: two moves for
// one blink). Also when the degraded plan was read back from JSON.
func TestBufferFlap(t *testing.T) {
	nodes := uniformNodes(4, 8, 64)
	spec := mustSpec(t, "scheduling:\n  train: {worker_num: 32, num_cpus: 1, num_gpus: 1}\n  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}\n")
	first, err := Compute(spec, nodes)
	if err != nil || first.Workers.Len() != 36 {
		t.Fatalf("setup: %v", err)
	}
	for _, gone := range []string{"n1", "n2", "n3", "n4"} {
		for _, readBack := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s json %v", gone, readBack), func(t *testing.T) {
				d, ch, err := Replan(first, spec, without(nodes, gone))
				var degraded *DegradedError
				if !errors.As(err, &degraded) || d.PlanState() != plan.StateDegraded {
					t.Fatalf("after %s left: state %q: %v", gone, d.PlanState(), err)
				}
				for _, w := range first.Workers.All() {
					if w.Component != plan.Buffer {
						continue
					}
					now := d.Workers.Find(plan.Buffer, w.Index)
					if w.NodeID != gone && (now == nil || !samePlace(w, now)) {
						t.Fatalf("buffer %d moved from %s to %+v", w.Index, w.NodeID, now)
					}
					if u := unplacedOf(d, plan.Buffer, w.Index); w.NodeID == gone && (now != nil || u == nil || u.NodeID != gone || u.Reason != WhyNodeLeft+" "+gone) {
						t.Fatalf("buffer %d of %s: placed %+v, unplaced %+v", w.Index, gone, now, u)
					}
				}
				if len(ch.Unplaced) != 9 || len(d.Unplaced) != 9 {
					t.Errorf("unplaced: %s", ch.Summary())
				}
				if readBack {
					b, _ := json.Marshal(d)
					var p Plan
					if err := json.Unmarshal(b, &p); err != nil {
						t.Fatal(err)
					}
					d = &p
				}
				back, _, err := Replan(d, spec, nodes)
				if err != nil || !back.Valid() || back.Moved != 9 {
					t.Fatalf("the node is back: valid %v, moved %d: %v", back.Valid(), back.Moved, err)
				}
				for _, w := range back.Workers.All() {
					if was := first.Workers.Find(w.Component, w.Index); was == nil || !samePlace(was, w) {
						t.Errorf("%s %d on %s %v, was on %+v", w.Component, w.Index, w.NodeID, w.GPUs, was)
					}
				}
				if !maps.EqualFunc(first.StorageToTrainWorkers, back.StorageToTrainWorkers, slices.Equal) {
					t.Errorf("buffers serve %v, served %v", back.StorageToTrainWorkers, first.StorageToTrainWorkers)
				}
				for _, e := range checkPlan(spec, nodes, back) {
					t.Error(e)
				}
			})
		}
	}
}
