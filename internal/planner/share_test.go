package planner

import (
	"fmt"
	"strings"
	"testing"
)

// shareNodes is n nodes of 8 GPUs and 64 CPUs.
func shareNodes(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("n%d", i), IP: fmt.Sprintf("10.0.0.%d", i+1), CPUs: 64, GPUs: 8}
	}
	return nodes
}

// trainSpec asks for train workers of one GPU each.
func trainSpec(t *testing.T, workers, priority, maxGPUs int) *Spec {
	t.Helper()
	quota := ""
	if maxGPUs > 0 {
		quota = fmt.Sprintf("max_gpus: %d\n", maxGPUs)
	}
	return specT(t, fmt.Sprintf("priority: %d\n%sscheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", priority, quota, workers))
}

// planAll runs PlanAll and returns the outcomes by name, checking that no
// GPU serves two jobs.
func planAll(t *testing.T, jobs []Job, nodes []Node) map[string]Outcome {
	t.Helper()
	out := PlanAll(jobs, nodes)
	owner := map[string]string{}
	byName := map[string]Outcome{}
	for j, o := range out {
		byName[jobs[j].Name] = o
		if o.Err == nil != o.Plan.Valid() {
			t.Fatalf("%s: error %v but valid %v", jobs[j].Name, o.Err, o.Plan.Valid())
		}
		for _, w := range o.Plan.Workers.All() {
			for _, g := range w.GPUs {
				k := fmt.Sprintf("%s:%d", w.NodeID, g)
				if prev, ok := owner[k]; ok && prev != jobs[j].Name {
					t.Fatalf("GPU %s given to %s and %s", k, prev, jobs[j].Name)
				}
				owner[k] = jobs[j].Name
			}
		}
	}
	return byName
}

func TestPlanAllShares(t *testing.T) {
	nodes := shareNodes(4) // 32 GPUs
	jobs := []Job{
		{Name: "a", Spec: trainSpec(t, 12, 0, 0), Age: 1},
		{Name: "b", Spec: trainSpec(t, 12, 0, 0), Age: 2},
	}
	out := planAll(t, jobs, nodes)
	if !out["a"].Plan.Valid() || !out["b"].Plan.Valid() || out["a"].Plan.GPUsHeld != 12 {
		t.Fatalf("two jobs of 12 GPUs on 32: %v %v", out["a"].Err, out["b"].Err)
	}

	// A third of higher priority takes what is free first, then the
	// lowest-priority room it needs.
	jobs[0].Prev, jobs[1].Prev = out["a"].Plan, out["b"].Plan
	jobs = append(jobs, Job{Name: "big", Spec: trainSpec(t, 16, 10, 0), Age: 3})
	jobs[1].Spec = trainSpec(t, 12, -1, 0) // b is the lowest now
	out = planAll(t, jobs, nodes)
	if !out["big"].Plan.Valid() || !out["a"].Plan.Valid() || out["a"].Plan.Moved != 0 {
		t.Fatalf("big valid %v, a valid %v moved %d", out["big"].Err, out["a"].Err, out["a"].Plan.Moved)
	}
	b := out["b"]
	if b.Plan.Valid() {
		t.Fatalf("b should give way: 12+16+12 > 32")
	}
	if !strings.HasPrefix(b.Plan.Error, "preempted by plan big (priority 10): ") || len(b.Plan.PreemptedBy) != 1 {
		t.Fatalf("b's error %q, preempted by %v", b.Plan.Error, b.Plan.PreemptedBy)
	}

	// big leaves: b comes back.
	jobs[0].Prev, jobs[1].Prev = out["a"].Plan, out["b"].Plan
	out = planAll(t, jobs[:2], nodes)
	if !out["b"].Plan.Valid() || out["a"].Plan.Moved != 0 {
		t.Fatalf("b back: %v; a moved %d", out["b"].Err, out["a"].Plan.Moved)
	}
}

func TestPlanAllPartialPreemption(t *testing.T) {
	nodes := shareNodes(2) // 16 GPUs
	low := Job{Name: "low", Spec: trainSpec(t, 8, 0, 0), Age: 1}
	first := planAll(t, []Job{low}, nodes)["low"].Plan
	low.Prev = first
	// high needs 12: 8 free, 4 from low, which shrinks to what is left
	// only by giving up 4 (invalid: it needs 8 and 4 remain).
	high := Job{Name: "high", Spec: trainSpec(t, 12, 5, 0), Age: 2}
	out := planAll(t, []Job{low, high}, nodes)
	if !out["high"].Plan.Valid() || out["low"].Plan.Valid() {
		t.Fatalf("high %v, low %v", out["high"].Err, out["low"].Plan.Valid())
	}
	// low asks for 4 instead: those of its workers whose GPUs high did
	// not take stay where they were, the others move to the 4 left.
	low.Spec = trainSpec(t, 4, 0, 0)
	high.Prev = out["high"].Plan
	low.Prev = first
	out = planAll(t, []Job{low, high}, nodes)
	lo := out["low"]
	taken := map[string]bool{}
	for _, w := range out["high"].Plan.Workers.All() {
		taken[fmt.Sprintf("%s:%d", w.NodeID, w.GPUs[0])] = true
	}
	stayed := 0
	for _, w := range lo.Plan.Workers.All() {
		was := first.Workers.Find(w.Component, w.Index)
		if !taken[fmt.Sprintf("%s:%d", was.NodeID, was.GPUs[0])] {
			stayed++
			if was.NodeID != w.NodeID || was.GPUs[0] != w.GPUs[0] {
				t.Fatalf("low worker %d moved from a GPU high did not take", w.Index)
			}
		}
	}
	if !lo.Plan.Valid() || lo.Plan.Moved != 4-stayed {
		t.Fatalf("low of 4 beside high of 12: %v, moved %d, stayed %d", lo.Err, lo.Plan.Moved, stayed)
	}
	if lo.Change.Summary() != "" && stayed < 4 && !strings.Contains(lo.Change.Summary(), "preempted by plan high") {
		t.Fatalf("low's change says %q", lo.Change.Summary())
	}
}

func TestPlanAllEqualPriorityNeverDisturbed(t *testing.T) {
	nodes := shareNodes(2)
	old := Job{Name: "old", Spec: trainSpec(t, 12, 3, 0), Age: 1}
	old.Prev = planAll(t, []Job{old}, nodes)["old"].Plan
	// A newcomer of the same priority does not fit beside it, and is
	// told what holds the room.
	newer := Job{Name: "newer", Spec: trainSpec(t, 8, 3, 0), Age: 2}
	out := planAll(t, []Job{newer, old}, nodes)
	if !out["old"].Plan.Valid() || out["old"].Plan.Moved != 0 || out["newer"].Plan.Valid() {
		t.Fatalf("old %v moved %d; newer valid %v", out["old"].Err, out["old"].Plan.Moved, out["newer"].Plan.Valid())
	}
	if e := out["newer"].Plan.Error; !strings.HasPrefix(e, "waits for room held by plan old (priority 3): Insufficient GPUs") {
		t.Fatalf("newer's error %q", e)
	}
	// An older job of the same priority that had no place does not
	// displace a younger one that has.
	young := Job{Name: "young", Spec: trainSpec(t, 12, 3, 0), Age: 5, Prev: old.Prev}
	elder := Job{Name: "elder", Spec: trainSpec(t, 8, 3, 0), Age: 1}
	out = planAll(t, []Job{young, elder}, nodes)
	if !out["young"].Plan.Valid() || out["young"].Plan.Moved != 0 || out["elder"].Plan.Valid() {
		t.Fatalf("young %v moved %d; elder valid %v", out["young"].Err, out["young"].Plan.Moved, out["elder"].Plan.Valid())
	}
}

func TestPlanAllQuota(t *testing.T) {
	nodes := shareNodes(4)
	out := planAll(t, []Job{{Name: "exp", Spec: trainSpec(t, 12, 0, 8)}}, nodes)
	if e := out["exp"].Plan.Error; out["exp"].Plan.Valid() || e != "max_gpus: the plan needs 12 GPUs; its quota is 8" {
		t.Fatalf("quota: valid %v, error %q", out["exp"].Plan.Valid(), e)
	}
	if out["exp"].Plan.Workers.Len() != 0 || len(out["exp"].Plan.Pools) != 0 {
		t.Fatal("an invalid plan places nothing")
	}
	out = planAll(t, []Job{{Name: "exp", Spec: trainSpec(t, 8, 0, 8)}}, nodes)
	if !out["exp"].Plan.Valid() || out["exp"].Plan.GPUsHeld != 8 {
		t.Fatalf("within quota: %v", out["exp"].Err)
	}
}

func TestPlanAllCPUs(t *testing.T) {
	nodes := []Node{{ID: "n0", IP: "10.0.0.1", CPUs: 10, GPUs: 8}}
	spec := func(prio int) *Spec {
		return specT(t, fmt.Sprintf("priority: %d\nscheduling:\n  train: {worker_num: 2, num_cpus: 4, num_gpus: 1}\n", prio))
	}
	out := planAll(t, []Job{{Name: "a", Spec: spec(1)}, {Name: "b", Spec: spec(0)}}, nodes)
	// 8 CPUs to a leave 2: b's 8 do not fit though 6 GPUs are free.
	if !out["a"].Plan.Valid() || out["b"].Plan.Valid() || !strings.Contains(out["b"].Plan.Error, "CPU") {
		t.Fatalf("a %v; b valid %v: %q", out["a"].Err, out["b"].Plan.Valid(), out["b"].Plan.Error)
	}
}

func TestParseSharing(t *testing.T) {
	for _, c := range []struct{ spec, err string }{
		{"priority: 1.5\nscheduling: {train: {worker_num: 1}}", "priority: 1.5 is not allowed"},
		{"priority: high\nscheduling: {train: {worker_num: 1}}", "priority: high is not allowed"},
		{"max_gpus: 0\nscheduling: {train: {worker_num: 1}}", "max_gpus: 0 is not allowed"},
		{"max_gpus: -3\nscheduling: {train: {worker_num: 1}}", "max_gpus: -3 is not allowed"},
	} {
		if _, err := ParseSpec([]byte(c.spec)); err == nil || !strings.HasPrefix(err.Error(), c.err) {
			t.Errorf("%q: %v; want %q", c.spec, err, c.err)
		}
	}
	s := specT(t, "priority: -7\nmax_gpus: 16\nscheduling: {train: {worker_num: 1}}")
	if s.Priority != -7 || s.MaxGPUs != 16 {
		t.Fatalf("parsed %+v", s)
	}
}

// TestPlanAllReservedGPUs: a GPU a plan's pools hold without a worker on
// it (reserved for a buffer; a manual pool's range) is the plan's: no
// other plan gets it, and a plan placed first is not moved for it.
func TestPlanAllReservedGPUs(t *testing.T) {
	nodes := shareNodes(2)
	buffered := specT(t, "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 1}\n")
	manual := specT(t, `
scheduling:
  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 1}
placement: {mode: manual}
resource_pool:
  - {name: train_pool, num_node: 1, num_gpus: 8, node_ids: [n0], train: "0-7"}
`)
	for _, c := range []struct {
		name  string
		other *Spec
		prio  int // a's, beside b's 0
	}{{"buffer reserve", buffered, 5}, {"manual ranges", manual, 5}, {"buffer reserve first", buffered, -1}, {"manual ranges first", manual, -1}} {
		t.Run(c.name, func(t *testing.T) {
			jobs := []Job{{Name: "a", Spec: trainSpec(t, 4, c.prio, 0), Age: 1}, {Name: "b", Spec: c.other, Age: 2}}
			out := planAll(t, jobs, nodes)
			checkPoolsApart(t, out)
			jobs[0].Prev, jobs[1].Prev = out["a"].Plan, out["b"].Plan
			again := planAll(t, jobs, nodes)
			checkPoolsApart(t, again)
			if again["a"].Plan.Moved != 0 || again["b"].Plan.Moved != 0 {
				t.Fatalf("replanned unchanged: a moved %d, b moved %d (%s)", again["a"].Plan.Moved, again["b"].Plan.Moved, again["a"].Change.Summary())
			}
			if b := again["b"].Plan; b.Valid() && b.GPUsHeld != HeldGPUs(b) {
				t.Fatalf("b holds %d, counts %d", b.GPUsHeld, HeldGPUs(b))
			}
		})
	}
}

// checkPoolsApart fails when two plans hold one GPU (a worker's or a
// pool's).
func checkPoolsApart(t *testing.T, out map[string]Outcome) {
	t.Helper()
	owner := map[string]string{}
	for name, o := range out {
		EachHeldGPU(o.Plan, func(node string, g int) {
			k := fmt.Sprintf("%s:%d", node, g)
			if other, ok := owner[k]; ok && other != name {
				t.Fatalf("GPU %s held by %s and %s", k, other, name)
			}
			owner[k] = name
		})
	}
}

// TestPlanAllInvalidStaysPut: a plan waiting for room keeps its error
// while other plans change around it (no new revision for it), and a
// job without a spec holds its last plan as it is.
func TestPlanAllInvalidStaysPut(t *testing.T) {
	nodes, low, high := preempted(t)
	was := low.Prev.Error
	// high shrinks by one: low still does not fit; its error stays.
	high.Spec = trainSpec(t, 11, 5, 0)
	out := planAll(t, []Job{low, high}, nodes)
	if got := out["low"].Plan; got.Valid() || got.Error != was || !SamePlacement(low.Prev, got) {
		t.Fatalf("low: valid %v, error %q (was %q)", got.Valid(), got.Error, was)
	}
	// A job without a spec keeps its plan, and nobody takes its GPUs.
	frozen := Job{Name: "frozen", Prev: out["high"].Plan, Age: 3}
	newer := Job{Name: "newer", Spec: trainSpec(t, 8, 9, 0), Age: 4}
	out = planAll(t, []Job{frozen, newer}, nodes)
	if out["frozen"].Plan != frozen.Prev || out["newer"].Plan.Valid() {
		t.Fatalf("frozen kept %v; newer valid %v", out["frozen"].Plan == frozen.Prev, out["newer"].Plan.Valid())
	}
}

// TestPlanAllInvalidSpecChanged: a waiting plan whose own spec changes is
// told afresh why it waits.
func TestPlanAllInvalidSpecChanged(t *testing.T) {
	nodes, low, high := preempted(t)
	low.Spec = trainSpec(t, 6, 0, 0) // still more than the 4 left
	got := planAll(t, []Job{low, high}, nodes)["low"].Plan
	if got.Valid() || got.Error == low.Prev.Error || !strings.Contains(got.Error, "required 6") {
		t.Fatalf("low after its own change: valid %v, error %q (was %q)", got.Valid(), got.Error, low.Prev.Error)
	}
}

// TestPlanAllWaitingReasonsRefresh: a waiting plan whose preemptor is
// gone is told who holds the room now; an error of its own spec is not
// put down to others.
func TestPlanAllWaitingReasonsRefresh(t *testing.T) {
	nodes, low, _ := preempted(t)
	other := Job{Name: "other", Spec: trainSpec(t, 12, 3, 0), Age: 3}
	got := planAll(t, []Job{low, other}, nodes)["low"].Plan // high gone, other holds 12
	if got.Valid() || strings.Contains(got.Error, "plan high") || !strings.Contains(got.Error, "plan other") {
		t.Fatalf("low with high gone: valid %v, error %q", got.Valid(), got.Error)
	}
	low.Spec = specT(t, `
scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1}}
placement: {mode: manual}
resource_pool: [{name: train_pool, num_node: 1, num_gpus: 8, node_ids: [n7], train: "0-7"}]
`)
	got = planAll(t, []Job{low, other}, nodes)["low"].Plan
	if got.Valid() || !strings.HasPrefix(got.Error, "resource_pool") {
		t.Fatalf("low's own error: %q", got.Error)
	}
}

// preempted is low (8 GPUs, priority 0) on two nodes of 8, then high (12
// GPUs, priority 5) arriving: low gives way, invalid. Each job's Prev is
// its outcome.
func preempted(t *testing.T) ([]Node, Job, Job) {
	t.Helper()
	nodes := shareNodes(2)
	low := Job{Name: "low", Spec: trainSpec(t, 8, 0, 0), Age: 1}
	low.Prev = planAll(t, []Job{low}, nodes)["low"].Plan
	high := Job{Name: "high", Spec: trainSpec(t, 12, 5, 0), Age: 2}
	out := planAll(t, []Job{low, high}, nodes)
	low.Prev, high.Prev = out["low"].Plan, out["high"].Plan
	if low.Prev.Valid() || !high.Prev.Valid() {
		t.Fatalf("low valid %v, high valid %v", low.Prev.Valid(), high.Prev.Valid())
	}
	return nodes, low, high
}

// TestPlanBeside: a validation sees the room plans of its priority or
// higher hold, and plans held as they are, as taken; lower plans' as
// free (they would give way).
func TestPlanBeside(t *testing.T) {
	nodes := shareNodes(2)
	out := planAll(t, []Job{{Name: "low", Spec: trainSpec(t, 8, 0, 0), Age: 1}, {Name: "mid", Spec: trainSpec(t, 4, 5, 0), Age: 2}}, nodes)
	others := []Job{{Name: "low", Spec: trainSpec(t, 8, 0, 0), Prev: out["low"].Plan}, {Name: "mid", Spec: trainSpec(t, 4, 5, 0), Prev: out["mid"].Plan}}
	for _, c := range []struct {
		spec  *Spec
		valid bool
	}{
		{trainSpec(t, 12, 5, 0), true},  // low gives way: 16 - 4
		{trainSpec(t, 13, 5, 0), false}, // 12 left beside mid
		{trainSpec(t, 5, 0, 0), false},  // 4 left beside low and mid
		{trainSpec(t, 4, 0, 4), true},
	} {
		if p, err := PlanBeside(c.spec, nodes, others); p.Valid() != c.valid || (err == nil) != c.valid {
			t.Errorf("%d train at priority %d: valid %v (%v), want %v", c.spec.Scheduling.Train.WorkerNum, c.spec.Priority, p.Valid(), err, c.valid)
		}
	}
	// Held as it is (no spec): in the way whatever the priority.
	others[0].Spec = nil
	if p, _ := PlanBeside(trainSpec(t, 12, 5, 0), nodes, others); p.Valid() {
		t.Error("a plan held as it is was not in the way")
	}
}

// TestPlanAllKeepsOverLower: a plan that would fit only by moving its own
// workers, because a lower plan's CPUs are in the way, takes them from
// the lower plan instead (found by TestPlanAllProperties).
func TestPlanAllKeepsOverLower(t *testing.T) {
	nodes := []Node{{ID: "n0", IP: "10.0.0.1", CPUs: 8, GPUs: 4}, {ID: "n1", IP: "10.0.0.2", CPUs: 8, GPUs: 1}}
	spec := func(prio int, workers string) *Spec {
		return specT(t, fmt.Sprintf("priority: %d\nscheduling:\n  %s\n", prio, workers))
	}
	mine := Job{Name: "mine", Spec: spec(2, "train: {worker_num: 1, num_cpus: 3, num_gpus: 1}"), Age: 5}
	low := Job{Name: "low", Spec: spec(0, "train: {worker_num: 1, num_cpus: 2, num_gpus: 1}"), Age: 6}
	out := planAll(t, []Job{mine, low}, nodes)
	mine.Prev, low.Prev = out["mine"].Plan, out["low"].Plan
	if w := low.Prev.Workers.At(0); w.NodeID != "n0" || mine.Prev.Workers.At(0).NodeID != "n0" {
		t.Fatalf("setup: mine on %s, low on %s", mine.Prev.Workers.At(0).NodeID, w.NodeID)
	}
	// An older plan of mine's priority needs 3 GPUs of n0 and 4 CPUs: it
	// takes low's GPU, and its CPUs leave mine room only with low's gone.
	elder := Job{Name: "elder", Spec: spec(2, "eval: {worker_num: 1, num_cpus: 4, num_gpus: 3}"), Age: 1}
	out = planAll(t, []Job{mine, low, elder}, nodes)
	if !out["elder"].Plan.Valid() || !out["mine"].Plan.Valid() || out["mine"].Plan.Moved != 0 {
		t.Fatalf("elder %v; mine %v, moved %d (%s)", out["elder"].Err, out["mine"].Err, out["mine"].Plan.Moved, out["mine"].Change.Summary())
	}
	if w := out["low"].Plan; !w.Valid() || w.Workers.At(0).NodeID != "n1" {
		t.Fatalf("low: valid %v, %s", w.Valid(), w.Error)
	}
}
