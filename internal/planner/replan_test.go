package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

func uniformNodes(n, gpus int, cpus float64) []Node {
	out := make([]Node, n)
	for i := range out {
		id := fmt.Sprintf("n%d", i+1)
		out[i] = Node{ID: id, IP: fmt.Sprintf("10.0.0.%d", i+1), CPUs: cpus, GPUs: gpus}
		for g := 0; g < gpus; g++ {
			out[i].GPUUUIDs = append(out[i].GPUUUIDs, fmt.Sprintf("GPU-%s-%d", id, g))
		}
	}
	return out
}

func mustSpec(t testing.TB, y string) *Spec {
	t.Helper()
	s, err := ParseSpec([]byte(y))
	if err != nil {
		t.Fatalf("ParseSpec: %v", err)
	}
	return s
}

const replanSpec = `
scheduling:
  train:  {worker_num: 16, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 2, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 8, num_cpus: 1, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

func without(nodes []Node, id string) []Node {
	var out []Node
	for _, n := range nodes {
		if n.ID != id {
			out = append(out, n)
		}
	}
	return out
}

// workerKey names a worker in tests.
type workerKey struct {
	comp  plan.Component
	index int
}

func workersOn(p *Plan, id string) map[workerKey]bool {
	out := map[workerKey]bool{}
	for _, w := range p.Workers.All() {
		if w.NodeID == id {
			out[workerKey{w.Component, w.Index}] = true
		}
	}
	return out
}

// withNode returns nodes with the one named id changed by f.
func withNode(nodes []Node, id string, f func(*Node)) []Node {
	out := slices.Clone(nodes)
	for i := range out {
		if out[i].ID == id {
			f(&out[i])
		}
	}
	return out
}

func TestReplanNodeLeftMovesOnlyItsWorkers(t *testing.T) {
	spec := mustSpec(t, replanSpec)
	nodes := uniformNodes(6, 8, 32)
	first, ch, err := Replan(nil, spec, nodes)
	if err != nil || !ch.Fresh || ch.FreshWhy != "first plan" {
		t.Fatalf("first plan: err %v, change %+v", err, ch)
	}
	checkStrict(t, spec, nodes, first)
	victim := first.Workers.At(0).NodeID // hosts train workers
	lost := workersOn(first, victim)
	rest := without(nodes, victim)
	next, ch, err := Replan(first, spec, rest)
	if err != nil || ch.Fresh {
		t.Fatalf("replan: err %v, change %+v", err, ch)
	}
	checkStrict(t, spec, rest, next)
	for _, d := range ch.Displaced {
		if d.Component == plan.Buffer {
			continue // buffers follow their train workers
		}
		if !lost[workerKey{d.Component, d.Index}] || d.Why != WhyNodeLeft || d.NodeID != victim {
			t.Errorf("displaced %+v, which was not on %s", d, victim)
		}
	}
	for _, w := range next.Workers.All() {
		k := workerKey{w.Component, w.Index}
		if o := first.Workers.Find(w.Component, w.Index); !lost[k] && w.Component != plan.Buffer && !samePlace(o, w) {
			t.Errorf("%s %d moved from %s%v to %s%v", w.Component, w.Index, o.NodeID, o.GPUs, w.NodeID, w.GPUs)
		}
	}
	if want := CountMoved(first, next); next.Moved != want || next.Moved < len(lost)-1 {
		t.Errorf("moved %d, CountMoved %d, lost %d", next.Moved, want, len(lost))
	}
	if got := ch.Summary(); !strings.Contains(got, WhyNodeLeft+" "+victim) {
		t.Errorf("summary %q does not name %s", got, victim)
	}
	x := explanationOf(next, plan.Train)
	if x == nil || len(x.Displaced) != 1 || x.Displaced[0].Reason != WhyNodeLeft || x.Displaced[0].NodeIDs[0] != victim {
		t.Errorf("train explanation %+v, want displaced by %s leaving", x, victim)
	}

	// The node coming back moves nobody.
	back, ch, err := Replan(next, spec, nodes)
	if err != nil || ch.Fresh || len(ch.Displaced) != 0 || back.Moved != 0 || !SamePlacement(next, back) {
		t.Fatalf("node back: err %v, change %+v, moved %d", err, ch, back.Moved)
	}
}

func explanationOf(p *Plan, c plan.Component) *plan.Explanation {
	for i := range p.Explanations {
		if p.Explanations[i].Component == c {
			return &p.Explanations[i]
		}
	}
	return nil
}

func TestReplanUnhealthyGPU(t *testing.T) {
	spec := mustSpec(t, replanSpec)
	nodes := uniformNodes(6, 8, 32)
	first, _, _ := Replan(nil, spec, nodes)
	w := *first.Workers.At(0)
	sick := withNode(nodes, w.NodeID, func(n *Node) { n.Unhealthy = []int{w.GPUs[0]} })
	next, ch, err := Replan(first, spec, sick)
	if err != nil || ch.Fresh {
		t.Fatalf("err %v, change %+v", err, ch)
	}
	checkStrict(t, spec, sick, next)
	want := Displaced{Component: w.Component, Index: w.Index, NodeID: w.NodeID, Why: WhyUnhealthy, Where: fmt.Sprintf("%s:%d", w.NodeID, w.GPUs[0])}
	if len(ch.Displaced) < 1 || ch.Displaced[0] != want || len(ch.Displaced) > 1 && ch.Displaced[1].Component != plan.Buffer {
		t.Errorf("displaced %+v, want only %+v", ch.Displaced, want)
	}
	// The worker may land on a node new to train, which then gets a
	// buffer worker of its own: that counts as a second move.
	if next.Moved < 1 || next.Moved > 2 || next.Moved != CountMoved(first, next) {
		t.Errorf("moved %d, want 1 or 2 (CountMoved %d)", next.Moved, CountMoved(first, next))
	}
	var text strings.Builder
	_ = WriteText(&text, next)
	row := ""
	for _, line := range strings.Split(text.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == w.NodeID {
			row = f[1]
		}
	}
	if len(row) != 8 || row[w.GPUs[0]] != 'x' || strings.Count(row, "x") != 1 || !strings.Contains(text.String(), "unhealthy GPU excluded on "+w.NodeID) {
		t.Errorf("the map row of %s is %q, want an x for GPU %d:\n%s", w.NodeID, row, w.GPUs[0], text.String())
	}
}

func TestReplanFallsBack(t *testing.T) {
	spec := mustSpec(t, replanSpec)
	nodes := uniformNodes(6, 8, 32)
	first, _ := Compute(spec, nodes)
	colo := mustSpec(t, strings.Replace(replanSpec, "disaggregate", "colocate", 1))

	// Fragmentation: the previous plan left one free GPU on each of two
	// nodes, where a fresh plan puts the two-GPU eval worker whole.
	frag := mustSpec(t, "scheduling: {eval: {worker_num: 1, num_gpus: 2}, env: [{worker_num: 2, num_gpus: 1}]}\n")
	small := []Node{{ID: "a", CPUs: 8, GPUs: 2}, {ID: "b", CPUs: 8, GPUs: 1, GPUUUIDs: []string{"b0"}}, {ID: "c", CPUs: 8, GPUs: 1, GPUUUIDs: []string{"c0"}}}
	fragPrev, err := Compute(frag, small)
	if err != nil {
		t.Fatal(err)
	}
	grown := []Node{{ID: "b", CPUs: 8, GPUs: 2, GPUUUIDs: []string{"b0", "b1"}}, {ID: "c", CPUs: 8, GPUs: 2, GPUUUIDs: []string{"c0", "c1"}}}

	tests := []struct {
		name  string
		prev  *Plan
		spec  *Spec
		nodes []Node
		fresh string // FreshWhy prefix; "" for an incremental attempt
		state plan.State
		err   string
	}{
		{"invalid previous", &Plan{Document: plan.Document{Header: plan.Header{Status: plan.Status{State: plan.StateInvalid}}}}, spec, nodes, "the previous plan was not valid", plan.StateValid, ""},
		{"placement changed", first, colo, nodes, "placement changed", plan.StateValid, ""},
		// The same spec on too little: degraded, not released.
		{"arithmetic refuses", first, spec, nodes[:2], "", plan.StateDegraded, "Insufficient GPUs"},
		// Another spec on too little: nothing to keep it for.
		{"arithmetic refuses a new spec", first, mustSpec(t, strings.Replace(replanSpec, "worker_num: 16", "worker_num: 15", 1)), nodes[:2], "", plan.StateInvalid, "Insufficient GPUs"},
		{"fragmented", fragPrev, frag, grown, "the incremental plan could not place every worker: Cannot place eval", plan.StateValid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ch, err := Replan(tt.prev, tt.spec, tt.nodes)
			if ch.Fresh != (tt.fresh != "") || !strings.HasPrefix(ch.FreshWhy, tt.fresh) {
				t.Errorf("change %+v, want fresh %q", ch, tt.fresh)
			}
			valid := tt.state == plan.StateValid
			if p.Valid() != valid || p.PlanState() != tt.state || (err == nil) != valid || !strings.Contains(p.Error, tt.err) {
				t.Errorf("valid %v state %q err %v, want state %q, error %q", p.Valid(), p.PlanState(), err, tt.state, tt.err)
			}
			switch tt.state {
			case plan.StateValid:
				checkStrict(t, tt.spec, tt.nodes, p)
			case plan.StateDegraded:
				if errs := checkPlan(tt.spec, tt.nodes, p); len(errs) > 0 || p.Workers.Len() == 0 || len(p.Unplaced) == 0 {
					t.Errorf("degraded plan: %d workers, %d unplaced: %v", p.Workers.Len(), len(p.Unplaced), errs)
				}
			default:
				if p.Workers.Len() != 0 || len(p.Pools) != 0 || len(p.ResourcePool) != 0 || p.Moved != 0 {
					t.Errorf("invalid plan carries a placement: %d workers, %d pools, moved %d", p.Workers.Len(), len(p.Pools), p.Moved)
				}
			}
		})
	}
}

// TestReplanBufferReserve: a buffer that uses CUDA keeps the GPU reserved
// for it when its node stays, and gets one again when it goes.
func TestReplanBufferReserve(t *testing.T) {
	spec := mustSpec(t, `
scheduling:
  train:  {worker_num: 12, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 1}
  env:    [{worker_num: 8, num_cpus: 1, num_gpus: 0.5}]
`)
	nodes := uniformNodes(4, 8, 64)
	first, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	reserveNode := ""
	for _, w := range first.Workers.All() {
		if w.Component == plan.Buffer && len(w.GPUs) > 0 {
			reserveNode = w.NodeID
		}
	}
	if reserveNode == "" {
		t.Fatalf("no buffer holds a GPU")
	}
	// Another node changes: the reserve stays where it is.
	other := "n4"
	next, ch, err := Replan(first, spec, withNode(nodes, other, func(n *Node) { n.CPUs = 63 }))
	if err != nil || ch.Fresh || next.Moved != 0 || !SamePlacement(first, next) {
		t.Fatalf("unrelated change: err %v change %+v moved %d", err, ch, next.Moved)
	}
	// The reserve's node loses its GPUs' health: the buffer's GPU is
	// reserved elsewhere and the plan stays valid and incremental.
	sick := withNode(nodes, reserveNode, func(n *Node) { n.Unhealthy = []int{0, 1, 2, 3, 4, 5, 6, 7} })
	next, ch, err = Replan(first, spec, sick)
	if err != nil || ch.Fresh {
		t.Fatalf("reserve node sick: err %v change %+v", err, ch)
	}
	checkStrict(t, spec, sick, next)
	holds := 0
	for _, w := range next.Workers.All() {
		if w.Component == plan.Buffer && len(w.GPUs) > 0 {
			holds++
		}
	}
	if holds != 1 {
		t.Errorf("%d buffers hold a GPU, want 1", holds)
	}
}

// TestReplanManual: in manual mode a GPU going bad moves its worker only,
// inside the pool's allocation, where planning afresh shifts every later
// worker by a GPU.
func TestReplanManual(t *testing.T) {
	spec := mustSpec(t, `
scheduling:
  env: [{worker_num: 12, num_cpus: 1, num_gpus: 1}]
placement: {mode: manual}
resource_pool:
  - {name: sim, num_node: 2, num_gpus: 8, env: "0-15"}
`)
	nodes := uniformNodes(2, 8, 64)
	first, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	sick := withNode(nodes, "n1", func(n *Node) { n.Unhealthy = []int{2} })
	next, ch, err := Replan(first, spec, sick)
	if err != nil || ch.Fresh || next.Moved != 1 || len(ch.Displaced) != 1 || ch.Displaced[0].Index != 2 {
		t.Fatalf("err %v change %+v moved %d", err, ch, next.Moved)
	}
	for _, e := range checkPlan(spec, sick, next) {
		t.Error(e)
	}
	if fresh, _ := Compute(spec, sick); CountMoved(first, fresh) < 5 {
		t.Errorf("a fresh plan moves %d workers; the test no longer shows the point", CountMoved(first, fresh))
	}
}

// checkStrict asserts the invariants every valid plan keeps, fresh or
// incremental (checkPlan), and that auto allocations are exactly the GPUs
// the workers hold and every worker names its GPUs' UUIDs.
func checkStrict(t fataler, spec *Spec, nodes []Node, p *Plan) {
	t.Helper()
	if !p.Valid() {
		t.Fatalf("plan not valid: %s", p.Error)
	}
	if errs := checkPlan(spec, nodes, p); len(errs) > 0 {
		t.Fatalf("invariants: %s", strings.Join(errs, "; "))
	}
	byID := map[string]*Node{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	for _, w := range p.Workers.All() {
		n := byID[w.NodeID]
		if n.hasUUIDs() && len(w.GPUUUIDs) != len(w.GPUs) {
			t.Fatalf("%s %d: uuids %v for GPUs %v", w.Component, w.Index, w.GPUUUIDs, w.GPUs)
		}
		for i, g := range w.GPUs {
			if i < len(w.GPUUUIDs) && w.GPUUUIDs[i] != n.GPUUUIDs[g] {
				t.Fatalf("%s %d: uuid %s for %s:%d, node has %s", w.Component, w.Index, w.GPUUUIDs[i], n.ID, g, n.GPUUUIDs[g])
			}
		}
	}
	if got := CountMoved(p, p); got != 0 {
		t.Fatalf("a plan moves %d workers against itself", got)
	}
}

// fataler is what the checks need of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func genReplanNodes(t *rapid.T, label string, n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		gpus := rapid.SampledFrom([]int{0, 2, 4, 8}).Draw(t, fmt.Sprintf("%s%d.gpus", label, i))
		nodes[i] = uniformNodes(1, gpus, float64(rapid.IntRange(2, 48).Draw(t, fmt.Sprintf("%s%d.cpus", label, i))))[0]
		nodes[i].ID = fmt.Sprintf("%s%d", label, i)
		for g := range nodes[i].GPUUUIDs {
			nodes[i].GPUUUIDs[g] = fmt.Sprintf("GPU-%s-%d", nodes[i].ID, g)
		}
		if gpus > 0 && rapid.IntRange(0, 5).Draw(t, fmt.Sprintf("%s%d.sick", label, i)) == 0 {
			nodes[i].Unhealthy = []int{rapid.IntRange(0, gpus-1).Draw(t, fmt.Sprintf("%s%d.sickGPU", label, i))}
		}
	}
	return nodes
}

// genReplanSpec draws a spec of any placement, with workers without GPUs,
// buffers with and without GPUs, and now and then a manual one.
func genReplanSpec(t *rapid.T) *Spec {
	s := &Spec{Placement: Placement{
		Mode:        ModeAuto,
		Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy"),
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, "env_strategy"),
	}}
	s.Scheduling.Train = &WorkerGroup{WorkerNum: rapid.IntRange(0, 8).Draw(t, "train"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{0.5, 1, 2, 0}).Draw(t, "train.gpus")}
	s.Scheduling.Eval = &WorkerGroup{WorkerNum: rapid.IntRange(0, 3).Draw(t, "eval"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{1, 2, 4, 0}).Draw(t, "eval.gpus")}
	for i := range rapid.IntRange(0, 2).Draw(t, "env.groups") {
		s.Scheduling.Env = append(s.Scheduling.Env, WorkerGroup{WorkerNum: rapid.IntRange(1, 8).Draw(t, fmt.Sprintf("env%d", i)),
			NumCPUs: float64(rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("env%d.cpus", i))),
			NumGPUs: rapid.SampledFrom([]float64{0.25, 0.5, 1, 0, 0.1, 0.3}).Draw(t, fmt.Sprintf("env%d.gpus", i))})
	}
	if rapid.Bool().Draw(t, "buffer") {
		s.Scheduling.Buffer = &WorkerGroup{Auto: true, NumCPUs: 1, NumGPUs: rapid.SampledFrom([]float64{0, 0, 1}).Draw(t, "buffer.gpus")}
	}
	return s
}

// manualOf is spec in manual mode with p's export as its pools.
func manualOf(t fataler, spec *Spec, p *Plan) *Spec {
	t.Helper()
	rp, _ := json.Marshal(p.ResourcePool)
	var raw []any
	_ = json.Unmarshal(rp, &raw)
	pools, err := parsePools(jsonNumbersToInts(raw))
	if err != nil {
		t.Fatalf("export does not parse: %v\n%s", err, rp)
	}
	m := *spec
	m.Placement = Placement{Mode: ModeManual}
	m.ResourcePool = pools
	return &m
}

// change is one inventory change of the replan property.
func change(t *rapid.T, nodes []Node, i int) ([]Node, string) {
	out := slices.Clone(nodes)
	k := rapid.IntRange(0, len(out)-1).Draw(t, fmt.Sprintf("change%d.node", i))
	n := &out[k]
	switch kind := rapid.IntRange(0, 8).Draw(t, fmt.Sprintf("change%d.kind", i)); kind {
	case 0:
		return slices.Delete(out, k, k+1), n.ID
	case 1:
		if n.GPUs > 0 {
			n.Unhealthy = append(slices.Clone(n.Unhealthy), rapid.IntRange(0, n.GPUs-1).Draw(t, fmt.Sprintf("change%d.gpu", i)))
		}
	case 2:
		n.CPUs = math.Floor(n.CPUs / 2)
	case 3:
		if n.GPUs > 0 {
			g := rapid.IntRange(0, n.GPUs-1).Draw(t, fmt.Sprintf("change%d.swapped", i))
			n.GPUUUIDs = slices.Clone(n.GPUUUIDs)
			n.GPUUUIDs[g] += "-new"
		}
	case 4:
		j := genReplanNodes(t, fmt.Sprintf("j%d.", i), 1)[0]
		return append(out, j), j.ID
	case 5:
		n.GPUs += 2
		n.GPUUUIDs = append(slices.Clone(n.GPUUUIDs), n.ID+"-x", n.ID+"-y")
	case 6: // planner drain NODE:GPU
		if n.GPUs > 0 {
			n.Drained = append(slices.Clone(n.Drained), rapid.IntRange(0, n.GPUs-1).Draw(t, fmt.Sprintf("change%d.drained", i)))
			slices.Sort(n.Drained)
			n.Drained = slices.Compact(n.Drained)
		}
	case 7: // planner drain NODE
		n.Out = true
	case 8: // planner undrain
		n.Out, n.Drained = false, nil
	}
	return out, n.ID
}

// TestReplanProperties: over random clusters, specs and chains of
// inventory changes, a replan leaves the previous plan as it was (its
// states are shared), keeps every invariant of a fresh plan, is
// valid whenever a fresh plan is, keeps every worker it does not say it
// displaced, displaces a worker only for a reason that holds, counts its
// moves as CountMoved does, exports a resource_pool that loads back, and
// plans alike from its in-memory previous plan and from that plan read
// back from JSON.
func TestReplanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genReplanSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		prev, err := Compute(spec, nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		if rapid.IntRange(0, 3).Draw(t, "manual") == 0 {
			spec = manualOf(t, spec, prev)
			if prev, err = Compute(spec, nodes); err != nil {
				t.Fatalf("the export loaded in manual mode: %v", err)
			}
		}
		for step := range rapid.IntRange(1, 3).Draw(t, "steps") {
			after, touched := change(t, nodes, step)
			if len(after) == 0 {
				return
			}
			before := snapshot(prev)
			next, ch, err := Replan(prev, spec, after)
			if snapshot(prev) != before {
				t.Fatalf("the replan wrote to the previous plan")
			}
			checkReplan(t, spec, prev, after, next, ch, err, touched)
			if !next.Placed() {
				return
			}
			prev, nodes = next, after
		}
	})
}

func checkReplan(t *rapid.T, spec *Spec, prev *Plan, after []Node, next *Plan, ch *Change, err error, touched string) {
	// (Buffers are left out, as checkPlan leaves their GPUs out: a
	// buffer that uses CUDA keeps its GPU when that GPU turns unhealthy
	// too, which is a matter of its own.)
	for _, w := range next.Workers.All() {
		for _, n := range after {
			if w.Component != plan.Buffer && n.ID == w.NodeID && (n.Out || slices.ContainsFunc(w.GPUs, func(g int) bool { return slices.Contains(n.Drained, g) })) {
				t.Fatalf("%s %d on drained %s%v (node out %v, drained GPUs %v)", w.Component, w.Index, w.NodeID, w.GPUs, n.Out, n.Drained)
			}
		}
	}
	if _, freshErr := Compute(spec, after); freshErr == nil && err != nil {
		t.Fatalf("a fresh plan is valid but the replan is not: %v", err)
	}
	var js Plan
	b, _ := json.Marshal(prev)
	if jerr := json.Unmarshal(b, &js); jerr != nil {
		t.Fatalf("plan JSON: %v", jerr)
	}
	slow, _, slowErr := Replan(&js, spec, after)
	if (err == nil) != (slowErr == nil) || !SamePlacement(next, slow) {
		t.Fatalf("replan from JSON differs: err %v vs %v", err, slowErr)
	}
	var degraded *DegradedError
	switch {
	case err != nil && !errors.As(err, &degraded):
		if next.Workers.Len() != 0 || len(next.Pools) != 0 || next.Error == "" || next.PlanState() != plan.StateInvalid {
			t.Fatalf("invalid plan carries a placement")
		}
		return
	case err != nil:
		// Degraded: the previous plan placed workers for this spec, and
		// neither an incremental plan nor a fresh one places them all.
		if next.PlanState() != plan.StateDegraded || next.Valid() || degraded.Unplaced != len(next.Unplaced) || ch.Fresh || !prev.Placed() {
			t.Fatalf("degraded: state %q valid %v, %d unplaced (error says %d), fresh %v", next.PlanState(), next.Valid(), len(next.Unplaced), degraded.Unplaced, ch.Fresh)
		}
		if errs := checkPlan(spec, after, next); len(errs) > 0 {
			t.Fatalf("degraded invariants: %s", strings.Join(errs, "; "))
		}
		if len(ch.Unplaced) != len(next.Unplaced) {
			t.Fatalf("the change lists %d unplaced, the plan %d", len(ch.Unplaced), len(next.Unplaced))
		}
		for _, d := range ch.Unplaced {
			o := prev.Workers.Find(d.Component, d.Index)
			if o == nil {
				if o = lastWorker(spec, unplacedOf(prev, d.Component, d.Index)); o == nil {
					continue // never placed
				}
			}
			if why := unjustified(spec, o, nil, d, after, next); why != "" {
				t.Fatalf("%s %d unplaced for %q at %s, but %s", d.Component, d.Index, d.Why, d.Where, why)
			}
		}
	default:
		checkStrict(t, spec, after, next)
		if next.PlanState() != plan.StateValid || len(next.Unplaced) != 0 {
			t.Fatalf("valid plan in state %q with %d unplaced", next.PlanState(), len(next.Unplaced))
		}
	}
	checkReplay(t, prev, next)
	checkReplay(t, &js, next)
	if next.Moved != CountMoved(prev, next) {
		t.Fatalf("moved %d, CountMoved %d", next.Moved, CountMoved(prev, next))
	}
	if err == nil {
		back, berr := Compute(manualOf(t, spec, next), after)
		if berr != nil || fmt.Sprint(allocSet(back)) != fmt.Sprint(allocSet(next)) || fmt.Sprint(countSet(back)) != fmt.Sprint(countSet(next)) {
			t.Fatalf("the export does not load back: %v", berr)
		}
	}
	if ch.Fresh {
		return
	}
	displaced := map[workerKey]Displaced{}
	for _, d := range ch.Displaced {
		displaced[workerKey{d.Component, d.Index}] = d
	}
	for _, w := range next.Workers.All() {
		if w.Component == plan.Buffer {
			continue
		}
		o := prev.Workers.Find(w.Component, w.Index)
		d, moved := displaced[workerKey{w.Component, w.Index}]
		if u := unplacedOf(prev, w.Component, w.Index); o == nil && u != nil {
			// Unplaced before: it goes back where it ran last, or is
			// displaced from there.
			if !moved && (u.NodeID != w.NodeID || !slices.Equal(u.GPUs, w.GPUs)) {
				t.Fatalf("%s %d, unplaced from %s%v, placed on %s%v without a reason", w.Component, w.Index, u.NodeID, u.GPUs, w.NodeID, w.GPUs)
			}
			o = lastWorker(spec, u)
		}
		if !moved && (o == nil || !samePlace(o, w)) {
			t.Fatalf("%s %d moved from %v to %s%v without a reason (change on %s)", w.Component, w.Index, o, w.NodeID, w.GPUs, touched)
		}
		if moved {
			if why := unjustified(spec, o, w, d, after, next); why != "" {
				t.Fatalf("%s %d displaced for %q at %s, but %s", w.Component, w.Index, d.Why, d.Where, why)
			}
		}
	}
}

// lastWorker is unplaced worker u as it ran last (nil: it never ran).
func lastWorker(spec *Spec, u *plan.Unplaced) *plan.Worker {
	if u == nil || u.NodeID == "" {
		return nil
	}
	if u.Component == plan.Buffer {
		return &plan.Worker{Component: u.Component, Index: u.Index, Pool: u.Pool, NodeID: u.NodeID, GPUs: u.GPUs, GPUUUIDs: u.GPUUUIDs, CPUs: spec.Scheduling.Buffer.NumCPUs}
	}
	_, g := newEngine(spec, Options{}).demands[u.Component.Rank()].groupAt(u.Index)
	w := &plan.Worker{Component: u.Component, Index: u.Index, Pool: u.Pool, NodeID: u.NodeID, GPUs: u.GPUs, GPUUUIDs: u.GPUUUIDs, CPUs: g.NumCPUs}
	if len(u.GPUs) > 0 {
		_, w.GPUShare = gpuCount(g)
	}
	return w
}

// unplacedOf is worker i of component c among p's unplaced, or nil.
func unplacedOf(p *Plan, c plan.Component, i int) *plan.Unplaced {
	for k := range p.Unplaced {
		if u := &p.Unplaced[k]; u.Component == c && u.Index == i {
			return u
		}
	}
	return nil
}

// unjustified says why displacement d of worker o (now w) does not hold on
// nodes and plan p, or "" when it does.
func unjustified(spec *Spec, o, w *plan.Worker, d Displaced, nodes []Node, p *Plan) string {
	var n *Node
	for i := range nodes {
		if nodes[i].ID == d.NodeID {
			n = &nodes[i]
		}
	}
	gpu := -1
	if _, g, ok := strings.Cut(d.Where, ":"); ok {
		fmt.Sscan(g, &gpu)
	}
	switch d.Why {
	case WhyNodeLeft:
		if n != nil {
			return "the node is there"
		}
		return ""
	case WhyNew:
		if o != nil {
			return "it was in the previous plan"
		}
		return ""
	case WhyPool:
		if spec.Placement.Mode != ModeManual {
			return "pools are fixed in auto mode"
		}
		return ""
	}
	if n == nil {
		return "the node left"
	}
	switch d.Why {
	case WhyDrained:
		if !n.Out && (gpu < 0 || !slices.Contains(n.Drained, gpu)) {
			return "neither the node nor the GPU is drained"
		}
	case WhyUnhealthy:
		if n.Healthy(gpu) {
			return "the GPU is healthy"
		}
	case WhyGPUGone:
		if gpu < n.GPUs {
			return "the GPU is there"
		}
	case WhyGPUReplaced:
		if gpu >= n.GPUs || slices.Index(o.GPUs, gpu) < 0 || o.GPUUUIDs[slices.Index(o.GPUs, gpu)] == n.GPUUUIDs[gpu] {
			return "the GPU is the same"
		}
	case WhyCPUs:
		load, train := 0.0, false
		for _, x := range p.Workers.All() {
			if x.NodeID == n.ID {
				load += x.CPUs
				train = train || x.Component == plan.Train
			}
		}
		extra := o.CPUs
		if o.Component == plan.Train && !train && spec.Scheduling.Buffer != nil {
			extra += spec.Scheduling.Buffer.NumCPUs
		}
		if load+extra <= n.CPUs+eps {
			return fmt.Sprintf("the node has %v CPUs for %v", n.CPUs, load+extra)
		}
	case WhyConflict:
		if !taken(spec, p, o, n.ID, gpu) {
			return "the GPU is free for it"
		}
	case WhyBuffer:
		if o.Component != plan.Buffer {
			return "only a buffer follows its train workers"
		}
		for _, x := range p.Workers.All() {
			if x.NodeID == n.ID && x.Component == plan.Train {
				return "its node hosts train workers"
			}
		}
	default:
		return "no such reason"
	}
	return ""
}

// taken reports whether GPU g of node holds what worker o may not join:
// a component it may not share with, or so much of its own component's
// share that its own does not fit beside it. The shares are summed, as
// the engine sums them (fits): two env halves fill a GPU that neither
// alone would keep an env quarter from. o itself is not counted, so a
// worker displaced for "GPU taken" and placed back on that same GPU is
// caught.
func taken(spec *Spec, p *Plan, o *plan.Worker, node string, g int) bool {
	if k := slices.Index(o.GPUs, g); k >= 0 && slices.Contains(o.GPUs[k+1:], g) {
		return true
	}
	r := newRules(spec.Placement)
	ci := o.Component.Rank()
	share := o.GPUShare
	for _, x := range p.Workers.All() {
		if x.NodeID != node || !slices.Contains(x.GPUs, g) || x.Component == o.Component && x.Index == o.Index {
			continue
		}
		cj := x.Component.Rank()
		if x.Component == plan.Buffer {
			cj = 0 // a buffer's GPU is train's reserve
		}
		if r.conflict[ci][cj] || x.Component == plan.Buffer && ci == 0 {
			return true
		}
		if cj == ci {
			share += x.GPUShare
		}
	}
	return share > 1+eps
}

// TestTakenSumsShares: the property's "GPU taken" check sums the shares
// its own component holds of the GPU, as the engine does, and does not
// count the worker asking. One node of one GPU holds env workers of the
// shares listed; o is an env worker of share want to join it.
func TestTakenSumsShares(t *testing.T) {
	for _, c := range []struct {
		name   string
		shares []float64 // one env group of one worker each
		o      plan.Worker
		want   bool
	}{
		// Neither half alone keeps a quarter out; both together do
		// (TestReplanProperties' seed of an env quarter unplaced for
		// "GPU taken" beside two env halves).
		{name: "two halves fill the GPU", shares: []float64{0.5, 0.5}, o: plan.Worker{Component: plan.Env, Index: 9, GPUShare: 0.25}, want: true},
		{name: "a half leaves room for a quarter", shares: []float64{0.5}, o: plan.Worker{Component: plan.Env, Index: 9, GPUShare: 0.25}},
		{name: "a half and a quarter leave room for a quarter", shares: []float64{0.5, 0.25}, o: plan.Worker{Component: plan.Env, Index: 9, GPUShare: 0.25}},
		{name: "three quarters leave no room for a half", shares: []float64{0.25, 0.25, 0.25}, o: plan.Worker{Component: plan.Env, Index: 9, GPUShare: 0.5}, want: true},
		// o is env 0 itself: beside the other half it fits.
		{name: "the worker itself is not counted", shares: []float64{0.5, 0.5}, o: plan.Worker{Component: plan.Env, Index: 0, GPUShare: 0.5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := &Spec{Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}
			spec.Scheduling.Train = &WorkerGroup{NumCPUs: 1, NumGPUs: 1}
			spec.Scheduling.Eval = &WorkerGroup{NumCPUs: 1, NumGPUs: 1}
			for _, f := range c.shares {
				spec.Scheduling.Env = append(spec.Scheduling.Env, WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: f})
			}
			nodes := uniformNodes(1, 1, 8)
			p, err := Compute(spec, nodes)
			if err != nil {
				t.Fatalf("planning %v on one GPU: %v", c.shares, err)
			}
			if got := taken(spec, p, &c.o, nodes[0].ID, 0); got != c.want {
				t.Errorf("taken = %v, want %v", got, c.want)
			}
		})
	}
}

// TestReplanReasonSeeds: chains of inventory changes TestReplanProperties
// found, replayed step by step; each step's displaced and unplaced
// workers must have a reason that holds (unjustified), and the last
// step leaves the worker named unplaced for the reason named.
func TestReplanReasonSeeds(t *testing.T) {
	for _, c := range []struct {
		name       string
		spec       *Spec
		nodes      []Node
		steps      []func([]Node) []Node
		comp       plan.Component
		index      int
		why, where string
	}{
		{
			// env 2 (a quarter, 2 CPUs) is unplaced from n0:0 when n0's
			// CPUs drop; env 1 (a half, no CPUs) moves there from n1 as
			// n1 leaves, beside env 0's half. When n0's CPUs drop again,
			// env 2's GPU is full: "GPU taken" holds, though no one
			// worker there keeps a quarter out.
			name: "two halves fill a quarter's GPU",
			spec: func() *Spec {
				s := &Spec{Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}
				s.Scheduling.Train = &WorkerGroup{NumCPUs: 1, NumGPUs: 0.5}
				s.Scheduling.Eval = &WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}
				s.Scheduling.Env = []WorkerGroup{{WorkerNum: 2, NumGPUs: 0.5}, {WorkerNum: 6, NumCPUs: 2, NumGPUs: 0.25}}
				return s
			}(),
			nodes: func() []Node {
				var out []Node
				for i, cpus := range []float64{3, 2, 8} {
					n := uniformNodes(1, 2, cpus)[0]
					n.ID = fmt.Sprintf("n%d", i)
					n.GPUUUIDs = []string{n.ID + "-0", n.ID + "-1"}
					out = append(out, n)
				}
				return out
			}(),
			steps: []func([]Node) []Node{
				func(ns []Node) []Node { return withNode(ns, "n0", func(n *Node) { n.CPUs = 1 }) },
				func(ns []Node) []Node {
					return slices.DeleteFunc(slices.Clone(ns), func(n Node) bool { return n.ID == "n1" })
				},
				func(ns []Node) []Node { return withNode(ns, "n0", func(n *Node) { n.CPUs = 0 }) },
			},
			comp: plan.Env, index: 2, why: WhyConflict, where: "n0:0",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			prev, err := Compute(c.spec, c.nodes)
			if err != nil {
				t.Fatalf("fresh plan: %v", err)
			}
			nodes := c.nodes
			var ch *Change
			for i, step := range c.steps {
				nodes = step(nodes)
				next, stepCh, _ := Replan(prev, c.spec, nodes)
				for _, d := range append(slices.Clone(stepCh.Displaced), stepCh.Unplaced...) {
					o := prev.Workers.Find(d.Component, d.Index)
					if o == nil {
						o = lastWorker(c.spec, unplacedOf(prev, d.Component, d.Index))
					}
					if o == nil {
						continue // new, never placed
					}
					if why := unjustified(c.spec, o, next.Workers.Find(d.Component, d.Index), d, nodes, next); why != "" {
						t.Errorf("step %d: %s %d displaced for %q at %s, but %s", i, d.Component, d.Index, d.Why, d.Where, why)
					}
				}
				prev, ch = next, stepCh
			}
			i := slices.IndexFunc(ch.Unplaced, func(d Displaced) bool { return d.Component == c.comp && d.Index == c.index })
			if i < 0 || ch.Unplaced[i].Why != c.why || ch.Unplaced[i].Where != c.where {
				t.Errorf("unplaced %+v, want %s %d for %q at %s", ch.Unplaced, c.comp, c.index, c.why, c.where)
			}
		})
	}
}

// countSet lists how many workers of each group are on each pool node.
func countSet(p *Plan) []string {
	var out []string
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes.All() {
			out = append(out, fmt.Sprint(pl.Name, n.NodeID, n.WorkerCounts))
		}
	}
	slices.Sort(out)
	return out
}

// TestReplanSpecChange: a resized spec keeps the workers whose needs it
// did not change; the new ones are placed, the removed ones released.
func TestReplanSpecChange(t *testing.T) {
	spec := mustSpec(t, replanSpec)
	nodes := uniformNodes(6, 8, 32)
	first, _ := Compute(spec, nodes)
	bigger := mustSpec(t, strings.Replace(replanSpec, "worker_num: 8, num_cpus: 1, num_gpus: 0.25", "worker_num: 12, num_cpus: 1, num_gpus: 0.25", 1))
	next, ch, err := Replan(first, bigger, nodes)
	if err != nil || ch.Fresh {
		t.Fatalf("err %v change %+v", err, ch)
	}
	checkStrict(t, bigger, nodes, next)
	if next.Moved != 4 || len(ch.Displaced) != 4 || ch.Displaced[0].Why != WhyNew {
		t.Errorf("moved %d, displaced %+v; want the 4 new env workers", next.Moved, ch.Displaced)
	}
	smaller := mustSpec(t, strings.Replace(replanSpec, "worker_num: 16, num_cpus: 1", "worker_num: 10, num_cpus: 1", 1))
	next, ch, err = Replan(first, smaller, nodes)
	if err != nil || ch.Fresh || len(ch.Displaced) != 0 {
		t.Fatalf("err %v change %+v", err, ch)
	}
	checkStrict(t, smaller, nodes, next)
}

// TestReplanLeavesPreviousAlone: replans share the previous plan's node
// states and worker chunks, and never write them: the service answers
// lookups from it while the next plan is made (run with -race).
func TestReplanLeavesPreviousAlone(t *testing.T) {
	nodes, spec := benchCluster(64)
	spec.Scheduling.Buffer.NumGPUs = 1
	prev, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	before := string(prev.AppendJSON(nil))
	changes := [][]Node{
		leave(nodes, 60, 3),
		withNode(nodes, "node-00003", func(n *Node) { n.Unhealthy = []int{0, 5} }),
		withNode(nodes, "node-00007", func(n *Node) { n.CPUs = 3 }),
		append(slices.Clone(nodes), Node{ID: "node-99999", CPUs: 64, GPUs: 8}),
	}
	done := make(chan bool)
	for _, after := range changes {
		go func() {
			next, _, err := Replan(prev, spec, after)
			if err == nil {
				_, _, _ = Replan(next, spec, nodes)
			}
			done <- err == nil
		}()
	}
	for range 20 {
		_ = prev.AppendJSON(nil)
	}
	for range changes {
		if !<-done {
			t.Error("a replan failed")
		}
	}
	if after := string(prev.AppendJSON(nil)); after != before {
		t.Fatalf("the previous plan changed")
	}
}

// TestReplanHostilePrevious: a previous plan document is anyone's (a file,
// a stream message): garbage components, indices up to 2^40, GPUs out of
// range, duplicates, absurd shares and allocations never make Replan panic
// or allocate without bound, and what it plans keeps the invariants.
func TestReplanHostilePrevious(t *testing.T) {
	specs := []string{replanSpec, `
scheduling:
  train:  {worker_num: 6, num_cpus: 1, num_gpus: 2}
  eval:   {worker_num: 3, num_cpus: 1, num_gpus: 0.5}
  buffer: {worker_num: 2, num_cpus: 1, num_gpus: 1}
  env:
    - {worker_num: 8, num_cpus: 1, num_gpus: 0.25}
    - {worker_num: 3, num_cpus: 0, num_gpus: 0}
placement: {mode: auto, strategy: colocate, env_strategy: device-colocate}
`, `
scheduling:
  train:  {worker_num: 4, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: 1, num_cpus: 1, num_gpus: 1}
  env:
    - {worker_num: 4, num_cpus: 1, num_gpus: 0.5}
placement: {mode: manual}
resource_pool:
  - {name: p0, num_node: 2, num_gpus: 8, train: "0-5", env: "6-9"}
  - {name: p1, num_node: 1, num_gpus: 8, env: "0-7", worker_counts: {env: [4]}}
`, `
scheduling:
  train:  {worker_num: 4, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: 1, num_cpus: 1, num_gpus: 1}
  env:
    - {worker_num: 4, num_cpus: 1, num_gpus: 0.5}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`}
	comps := []string{"train", "eval", "env", "buffer", "bogus", ""}
	var parsed []*Spec
	for _, y := range specs {
		parsed = append(parsed, mustSpec(t, y))
	}
	rapid.Check(t, func(t *rapid.T) {
		spec := parsed[rapid.IntRange(0, len(specs)-1).Draw(t, "spec")]
		nodes := uniformNodes(rapid.IntRange(0, 5).Draw(t, "nodes"), 8, 64)
		if rapid.Bool().Draw(t, "odd") && len(nodes) > 0 {
			nodes[0].Unhealthy = []int{-3, 99, 2}
			nodes[0].GPUs = rapid.IntRange(0, 12).Draw(t, "g0")
		}
		ints := func(label string) []int {
			return rapid.SliceOfN(rapid.SampledFrom([]int{-1 << 40, -1, 0, 1, 2, 3, 7, 8, 1 << 40}), 0, 4).Draw(t, label)
		}
		var ws []map[string]any
		for i := range rapid.IntRange(0, 40).Draw(t, "nw") {
			ws = append(ws, map[string]any{
				"component": rapid.SampledFrom(comps).Draw(t, fmt.Sprint("c", i)),
				"index":     rapid.SampledFrom([]int{-1, 0, 1, 2, 3, 5, 15, 1 << 40}).Draw(t, fmt.Sprint("i", i)),
				"pool":      rapid.SampledFrom([]string{"train_pool", "rollout_pool", "global_pool", "p0", "p1", "x"}).Draw(t, fmt.Sprint("p", i)),
				"node_id":   fmt.Sprintf("n%d", rapid.IntRange(0, 6).Draw(t, fmt.Sprint("n", i))),
				"gpus":      ints(fmt.Sprint("g", i)),
				"gpu_uuids": rapid.SliceOfN(rapid.SampledFrom([]string{"GPU-n1-0", "x"}), 0, 3).Draw(t, fmt.Sprint("u", i)),
				"gpu_share": rapid.SampledFrom([]float64{-1, 0, 0.25, 0.5, 1, 1e300}).Draw(t, fmt.Sprint("s", i)),
				"cpus":      rapid.SampledFrom([]float64{-1, 0, 1, 1e300}).Draw(t, fmt.Sprint("cpu", i)),
			})
		}
		var pools []map[string]any
		for i := range rapid.IntRange(0, 3).Draw(t, "np") {
			var pns []map[string]any
			for j := range rapid.IntRange(0, 4).Draw(t, fmt.Sprint("pn", i)) {
				a, b := rapid.SampledFrom([]int{-1 << 40, -1, 0, 3, 7, 100, 1 << 40}).Draw(t, fmt.Sprint("a", i, j)), rapid.SampledFrom([]int{-1, 0, 3, 7, 1 << 40}).Draw(t, fmt.Sprint("b", i, j))
				pns = append(pns, map[string]any{
					"node_id":     fmt.Sprintf("n%d", rapid.IntRange(0, 6).Draw(t, fmt.Sprint("pnn", i, j))),
					"allocations": map[string]any{rapid.SampledFrom(comps).Draw(t, fmt.Sprint("ac", i, j)): [][]int{{a, b}}},
				})
			}
			pools = append(pools, map[string]any{"name": rapid.SampledFrom([]string{"train_pool", "rollout_pool", "global_pool", "p0"}).Draw(t, fmt.Sprint("pname", i)), "nodes": pns})
		}
		mode := spec.Placement.Mode
		doc := map[string]any{"valid": true, "mode": mode, "strategy": spec.Placement.Strategy, "env_strategy": spec.Placement.EnvStrategy,
			"workers": ws, "pools": pools, "storage_to_train_workers": map[string][]int{"0": {0, 1}, "x": {-5}, "99999999999": nil}}
		if mode == ModeManual {
			doc["strategy"], doc["env_strategy"] = "", ""
		}
		b, _ := json.Marshal(doc)
		var prev Plan
		if err := json.Unmarshal(b, &prev); err != nil {
			t.Fatalf("unmarshal: %v", err)
		}
		p, _, err := Replan(&prev, spec, nodes)
		if err == nil {
			if msgs := checkPlan(spec, nodes, p); len(msgs) > 0 {
				t.Fatalf("invariants: %v", msgs)
			}
			// and once more from the result, fast path
			p2, _, err := Replan(p, spec, nodes[:len(nodes)/2])
			if err == nil {
				if msgs := checkPlan(spec, nodes[:len(nodes)/2], p2); len(msgs) > 0 {
					t.Fatalf("invariants 2: %v", msgs)
				}
			}
		}
	})
}

// TestReplanSharesUnderColocate: under colocate train may share a GPU
// eval and env hold whole; a displaced train worker finds it, and the
// replan stays incremental.
func TestReplanSharesUnderColocate(t *testing.T) {
	spec := mustSpec(t, `
scheduling:
  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}
  eval:  {worker_num: 2, num_cpus: 0, num_gpus: 1}
  env:
    - {worker_num: 2, num_cpus: 0, num_gpus: 1}
placement: {mode: auto, strategy: colocate, env_strategy: default}
`)
	nodes := []Node{{ID: "n1", IP: "1", CPUs: 2, GPUs: 2}, {ID: "n2", IP: "2", CPUs: 10, GPUs: 2}}
	first, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	after := withNode(nodes, "n1", func(n *Node) { n.CPUs = 1 })
	next, ch, err := Replan(first, spec, after)
	if err != nil || ch.Fresh || next.Moved != 1 {
		t.Fatalf("err %v change %+v moved %d", err, ch, next.Moved)
	}
	checkStrict(t, spec, after, next)
}

// stateSnap is what a plan's state holds of one node, copied.
type stateSnap struct {
	free       int
	share      [nComp][]float64
	resv       []bool
	cpuLeft    float64
	count      [nComp]int32
	gcount     [nComp][]int32
	firstTrain int
	slots      []slotRange
	notes      []nodeNote
	doc        [2]*plan.PoolNode
}

// snapshot copies what a replan must leave alone: the plan's node states,
// workers and buffers' map.
func snapshot(p *Plan) string {
	var states []stateSnap
	if p.state != nil {
		for _, ns := range p.state.table {
			s := stateSnap{free: int(ns.free), resv: slices.Clone(ns.resv()), cpuLeft: ns.cpuLeft, count: ns.count,
				firstTrain: int(ns.firstTrain), slots: slices.Clone(ns.slots()), notes: slices.Clone(ns.notes()), doc: [2]*plan.PoolNode{ns.doc(0), ns.doc(1)}}
			for c := range comp(nComp) {
				s.share[c] = slices.Clone(ns.shareOf(c))
				s.gcount[c] = slices.Clone(ns.gcountOf(c))
			}
			states = append(states, s)
		}
	}
	return fmt.Sprintf("%+v %s", states, p.AppendJSON(nil))
}

// TestReplanTouchesOnlyTheChange: after a node leaves, the replan shares
// the previous plan's state of every node but those that take its
// workers, and its worker chunks but those that hold them.
func TestReplanTouchesOnlyTheChange(t *testing.T) {
	nodes, spec := benchCluster(400)
	prev, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	after := leave(nodes, 375, 1)
	next, ch, err := Replan(prev, spec, after)
	if err != nil || ch.Fresh {
		t.Fatalf("err %v change %+v", err, ch)
	}
	old := map[string]*nodeState{}
	for _, ns := range prev.state.table {
		old[ns.node.ID] = ns
	}
	copied := 0
	for _, ns := range next.state.table {
		if old[ns.node.ID] != ns {
			copied++
		}
	}
	// 20 workers left with the node: 2 train, 2 eval, 16 env; two or three
	// spare nodes take them.
	if copied > 4 {
		t.Errorf("%d node states copied for one node leaving", copied)
	}
	shared := 0
	for k, c := range next.Workers.Chunks() {
		if k < len(prev.Workers.Chunks()) && len(c) > 0 && len(prev.Workers.Chunks()[k]) > 0 && &c[0] == &prev.Workers.Chunks()[k][0] {
			shared++
		}
	}
	if len(next.Workers.Chunks())-shared > 6 {
		t.Errorf("%d of %d worker chunks copied", len(next.Workers.Chunks())-shared, len(next.Workers.Chunks()))
	}
}

// checkReplay: applying Diff(prev, next), through JSON, to prev's document
// gives next's, as a reader of the revision events would rebuild it.
func checkReplay(t fataler, prev, next *Plan) {
	t.Helper()
	before := prev.Document
	before.Revision = 1
	var start plan.Document
	b, _ := json.Marshal(&before)
	if err := json.Unmarshal(b, &start); err != nil {
		t.Fatalf("document JSON: %v", err)
	}
	r := plan.NewReplay(&start)
	ev := plan.Event{Header: next.Header, Change: Diff(prev, next)}
	ev.Revision = 2
	b, _ = json.Marshal(&ev)
	var got plan.Event
	if err := json.Unmarshal(b, &got); err != nil || got.Kind() != "change" {
		t.Fatalf("event JSON (%s): %v", got.Kind(), err)
	}
	if err := r.Apply(&got); err != nil {
		t.Fatalf("apply: %v", err)
	}
	want := next.Document
	want.Revision = 2
	if a, b := string(r.Document().AppendJSON(nil)), string(want.AppendJSON(nil)); a != b {
		t.Fatalf("replayed revision differs:\n got %s\nwant %s\nchange %s", a, b, mustJSON(ev.Change))
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
