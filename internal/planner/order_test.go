package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// keys is a set of GPU keys.
func keys(ks ...string) map[string]bool {
	out := map[string]bool{}
	for _, k := range ks {
		out[k] = true
	}
	return out
}

// replaySteps applies steps to held as the stream would show them: a
// plan's new revision makes it hold next, its release step held ∩
// next. It fails when, after any step, one GPU is held by two plans,
// when a plan's steps are not at most one release then one new
// revision, or when the plans do not end holding next.
func replaySteps(held, next []map[string]bool, steps []Step) error {
	cur := slices.Clone(held)
	finals, releases := make([]int, len(held)), make([]int, len(held))
	for pos, st := range steps {
		i := st.Plan
		if finals[i] > 0 {
			return fmt.Errorf("step %d: plan %d publishes after its new revision", pos, i)
		}
		if st.Release {
			releases[i]++
			both := map[string]bool{}
			for k := range cur[i] {
				if next[i][k] {
					both[k] = true
				}
			}
			cur[i] = both
		} else {
			finals[i]++
			cur[i] = next[i]
		}
		owner := map[string]int{}
		for j, c := range cur {
			for k := range c {
				if o, ok := owner[k]; ok {
					return fmt.Errorf("after step %d (%+v): %s held by plans %d and %d", pos, st, k, o, j)
				}
				owner[k] = j
			}
		}
	}
	for i := range held {
		if finals[i] != 1 || releases[i] > 1 {
			return fmt.Errorf("plan %d: %d new revisions, %d release steps", i, finals[i], releases[i])
		}
		if !maps.Equal(cur[i], next[i]) {
			return fmt.Errorf("plan %d ends holding %v, not %v", i, cur[i], next[i])
		}
	}
	return nil
}

// describeSteps reads steps as A, release B, ...
func describeSteps(steps []Step) string {
	var parts []string
	for _, st := range steps {
		s := string(rune('A' + st.Plan))
		if st.Release {
			s = "release " + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// TestPublishOrder: releases before takes, a chain from its end, a
// cycle broken by one release step, plans that change nothing anywhere.
func TestPublishOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		held, next []map[string]bool
		want       string
	}{
		{"giver first", []map[string]bool{keys("1", "2"), keys()}, []map[string]bool{keys("2"), keys("1")}, "A, B"},
		{"giver listed last", []map[string]bool{keys(), keys("1", "2")}, []map[string]bool{keys("1"), keys("2")}, "B, A"},
		{"chain", []map[string]bool{keys("c"), keys("b"), keys("a")}, []map[string]bool{keys("b"), keys("a"), keys()}, "C, B, A"},
		{"give and take, no cycle", []map[string]bool{keys("x"), keys("y"), keys()}, []map[string]bool{keys("y"), keys(), keys("x")}, "B, A, C"},
		{"swap", []map[string]bool{keys("a", "k"), keys("b")}, []map[string]bool{keys("b", "k"), keys("a")}, "release A, B, A"},
		{"swap, the second frees more", []map[string]bool{keys("a"), keys("b", "c"), keys()}, []map[string]bool{keys("b"), keys("a"), keys("c")}, "release B, A, B, C"},
		{"three-cycle", []map[string]bool{keys("a"), keys("b"), keys("c")}, []map[string]bool{keys("b"), keys("c"), keys("a")}, "release A, C, B, A"},
		{"unchanged", []map[string]bool{keys("a"), keys("b")}, []map[string]bool{keys("a"), keys("b")}, "A, B"},
		{"nothing held", []map[string]bool{keys(), keys()}, []map[string]bool{keys("a"), keys("b")}, "A, B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := PublishOrder(tc.held, tc.next)
			if got := describeSteps(steps); got != tc.want {
				t.Errorf("order %q, want %q", got, tc.want)
			}
			if err := replaySteps(tc.held, tc.next, steps); err != nil {
				t.Error(err)
			}
		})
	}
	// New revisions that overlap (a bug elsewhere): every plan still
	// publishes once.
	held, next := []map[string]bool{keys("a"), keys()}, []map[string]bool{keys("a"), keys("a")}
	if got := describeSteps(PublishOrder(held, next)); got != "A, B" {
		t.Errorf("overlapping: %q", got)
	}
}

// drawHoldings draws the holdings of n plans over GPU keys g0..g11,
// each GPU held by one plan or none: before and after.
func drawHoldings(t *rapid.T, n int) (held, next []map[string]bool) {
	held, next = make([]map[string]bool, n), make([]map[string]bool, n)
	for i := range n {
		held[i], next[i] = map[string]bool{}, map[string]bool{}
	}
	for g := range 12 {
		k := fmt.Sprintf("g%d", g)
		if o := rapid.IntRange(-1, n-1).Draw(t, "held"+k); o >= 0 {
			held[o][k] = true
		}
		if o := rapid.IntRange(-1, n-1).Draw(t, "next"+k); o >= 0 {
			next[o][k] = true
		}
	}
	return held, next
}

// cyclic says whether plans take from each other in a cycle: i → j
// when j takes what i gives up.
func cyclic(held, next []map[string]bool) bool {
	n := len(held)
	edge := func(i, j int) bool {
		for k := range next[j] {
			if i != j && held[i][k] && !held[j][k] && !next[i][k] {
				return true
			}
		}
		return false
	}
	state := make([]int, n) // 0 new, 1 on the path, 2 done
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = 1
		for j := range n {
			if edge(i, j) && (state[j] == 1 || state[j] == 0 && visit(j)) {
				return true
			}
		}
		state[i] = 2
		return false
	}
	for i := range n {
		if state[i] == 0 && visit(i) {
			return true
		}
	}
	return false
}

// TestPublishOrderProperties: for random holdings of up to six plans,
// replaying the order never shows one GPU in two plans' latest
// revisions; each plan publishes its new revision once, after at most
// one release step; a plan that only gives publishes no release step;
// and without a cycle there is none at all.
func TestPublishOrderProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "plans")
		held, next := drawHoldings(t, n)
		steps := PublishOrder(held, next)
		if err := replaySteps(held, next, steps); err != nil {
			t.Fatalf("%s: %v", describeSteps(steps), err)
		}
		releases := 0
		for _, st := range steps {
			if st.Release {
				releases++
				if subset(next[st.Plan], held[st.Plan]) {
					t.Fatalf("%s: plan %d takes nothing, yet publishes a release step", describeSteps(steps), st.Plan)
				}
			}
		}
		if releases > 0 && !cyclic(held, next) {
			t.Fatalf("%s: release steps without a cycle", describeSteps(steps))
		}
		if cyclic(held, next) && releases == 0 {
			t.Fatalf("%s: a cycle, no release step", describeSteps(steps))
		}
	})
}

// swapSpec fits one 8-GPU node: 4 GPUs of train, 2 of env.
const swapSpec = `
scheduling:
  train:  {worker_num: 4, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 4, num_cpus: 1, num_gpus: 0.5}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// swapPlans are two plans on two 8-GPU nodes that swap: a held n1,
// b n2; now a takes n2 and b n1.
func swapPlans(t *testing.T) (aPrev, aNext, bPrev, bNext *Plan) {
	t.Helper()
	spec, err := ParseSpec([]byte(swapSpec))
	if err != nil {
		t.Fatal(err)
	}
	node := func(id string) Node {
		n := Node{ID: id, IP: "10.0.0.1", CPUs: 64, GPUs: 8}
		for g := range 8 {
			n.GPUUUIDs = append(n.GPUUUIDs, fmt.Sprintf("GPU-%s-%d", id, g))
		}
		return n
	}
	on := func(id string) *Plan {
		p, err := Compute(spec, []Node{node(id)})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return on("n1"), on("n2"), on("n2"), on("n1")
}

// TestReleaseStep: a swap's release step keeps what the plan holds and
// keeps of its new placement, takes nothing, and is a consistent
// document: pools, export, buffers and counts of what it keeps.
func TestReleaseStep(t *testing.T) {
	t.Parallel()
	aPrev, aNext, bPrev, bNext := swapPlans(t)
	held := []map[string]bool{GPUKeys(aPrev), GPUKeys(bPrev)}
	next := []map[string]bool{GPUKeys(aNext), GPUKeys(bNext)}
	steps := PublishOrder(held, next)
	if got := describeSteps(steps); got != "release A, B, A" {
		t.Fatalf("order %q", got)
	}
	// Whole-node swap: nothing of a's new placement is on GPUs it
	// holds; the release step places nothing.
	step := ReleaseStep(aPrev, aNext, held[0], nil, []string{"b"})
	if step.Workers.Len() != 0 || step.GPUsHeld != 0 || len(step.StorageToTrainWorkers) != 0 {
		t.Fatalf("release step: %d workers, %d GPUs, buffers %v", step.Workers.Len(), step.GPUsHeld, step.StorageToTrainWorkers)
	}
	for _, pl := range step.Pools {
		if pl.Nodes.Len() != 0 {
			t.Fatalf("pool %s keeps %d nodes", pl.Name, pl.Nodes.Len())
		}
	}

	// On nodes no plan changed on, nothing is known to be given up:
	// everything stays.
	if step := ReleaseStep(aPrev, aNext, map[string]bool{}, map[string]bool{"elsewhere": true}, []string{"b"}); step.Workers.Len() != aNext.Workers.Len() || step.GPUsHeld != HeldGPUs(aNext) {
		t.Fatalf("untouched nodes: %d of %d workers, %d of %d GPUs", step.Workers.Len(), aNext.Workers.Len(), step.GPUsHeld, HeldGPUs(aNext))
	}

	// Half a node: a keeps what it has of n1 and gives the rest up.
	half := map[string]bool{}
	for g := range 4 {
		half[gpuKey("n2", g)] = true
		half[fmt.Sprintf("uuid:GPU-n2-%d", g)] = true
	}
	step = ReleaseStep(bPrev, aNext, half, nil, []string{"b"})
	for _, w := range step.Workers.All() {
		if !within(w, half, nil) {
			t.Fatalf("release step keeps %s %d on %s %v, not held", w.Component, w.Index, w.NodeID, w.GPUs)
		}
	}
	if !subset(GPUKeys(step), half) {
		t.Fatalf("release step holds %v beyond %v", GPUKeys(step), half)
	}
	kept := map[plan.Component]int{}
	for _, w := range step.Workers.All() {
		kept[w.Component]++
	}
	counted := map[plan.Component]int{}
	for _, pl := range step.Pools {
		for _, n := range pl.Nodes.All() {
			for _, c := range plan.GPUComponents {
				for _, k := range *n.WorkerCounts.Of(c) {
					counted[c] += k
				}
			}
		}
	}
	for _, c := range plan.GPUComponents {
		if kept[c] != counted[c] {
			t.Errorf("%s: %d workers kept, pool counts say %d", c, kept[c], counted[c])
		}
	}
	if step.Workers.Len() == 0 || step.Workers.Len() == aNext.Workers.Len() {
		t.Fatalf("half a node keeps %d of %d workers", step.Workers.Len(), aNext.Workers.Len())
	}
	if len(step.ResourcePool) != len(aNext.ResourcePool) || !strings.Contains(step.Warnings[len(step.Warnings)-1], "plan b") {
		t.Fatalf("export %v, warnings %v", step.ResourcePool, step.Warnings)
	}
}

// TestTakersProperties: for random holdings, Takers names exactly the
// other plans that take a GPU a plan gives up (in plan order), and every
// release step PublishOrder orders has someone waiting for it.
func TestTakersProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "plans")
		held, next := drawHoldings(t, n)
		jobs := make([]Job, n)
		for i := range jobs {
			jobs[i].Name = string(rune('A' + i))
		}
		for i := range n {
			var want []string
			for j := range n {
				for k := range held[i] {
					if j != i && !next[i][k] && next[j][k] && !held[j][k] {
						want = append(want, jobs[j].Name)
						break
					}
				}
			}
			if got := Takers(jobs, held, next, i); !slices.Equal(got, want) {
				t.Fatalf("plan %s: takers %v, want %v", jobs[i].Name, got, want)
			}
		}
		for _, st := range PublishOrder(held, next) {
			if st.Release && len(Takers(jobs, held, next, st.Plan)) == 0 {
				t.Fatalf("%s: a release step of %s, whom nobody waits for", describeSteps(PublishOrder(held, next)), jobs[st.Plan].Name)
			}
		}
	})
}

// TestHeldSharesProperties: what a plan's workers use (HeldShares) is
// never negative nor more than the GPU places its workers name (a share
// is at most a GPU), those places exactly when every worker holds its
// GPUs whole, and nothing only when no worker uses any GPU. (It may pass
// HeldGPUs: colocated workers share GPUs, which HeldGPUs counts once.)
func TestHeldSharesProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, err := Compute(genSpec(t), genNodes(t))
		if err != nil {
			return
		}
		shares := HeldShares(p)
		whole, slots, uses := true, 0, false
		for _, w := range p.Workers.All() {
			whole = whole && (len(w.GPUs) == 0 || w.GPUShare == 1)
			slots += len(w.GPUs)
			uses = uses || len(w.GPUs) > 0 && w.GPUShare > 0
		}
		if shares < 0 || shares > float64(slots)+1e-9 || (shares > 0) != uses {
			t.Fatalf("shares %v of %d GPU places (some used: %v)", shares, slots, uses)
		}
		if whole && shares != float64(slots) {
			t.Fatalf("whole-GPU workers in %d GPU places hold %v shares", slots, shares)
		}
	})
}
