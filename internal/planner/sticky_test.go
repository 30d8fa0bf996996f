package planner

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
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

const stickySpec = `
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
	comp  Component
	index int
}

func workersOn(p *Plan, id string) map[workerKey]bool {
	out := map[workerKey]bool{}
	for _, w := range p.Workers {
		if w.NodeID == id {
			out[workerKey{w.Component, w.Index}] = true
		}
	}
	return out
}

func TestReplanNodeLeftMovesOnlyItsWorkers(t *testing.T) {
	spec := mustSpec(t, stickySpec)
	nodes := uniformNodes(6, 8, 32)
	first, ch, err := Replan(nil, spec, nodes)
	if err != nil || !ch.Fresh || ch.FreshWhy != "first plan" {
		t.Fatalf("first plan: err %v, change %+v", err, ch)
	}
	checkSticky(t, spec, nodes, first)
	victim := first.Workers[0].NodeID // hosts train workers
	lost := workersOn(first, victim)
	rest := without(nodes, victim)
	next, ch, err := Replan(first, spec, rest)
	if err != nil {
		t.Fatalf("replan: %v", err)
	}
	if ch.Fresh {
		t.Fatalf("replan went fresh: %s", ch.FreshWhy)
	}
	checkSticky(t, spec, rest, next)
	for _, d := range ch.Displaced {
		if d.Component != Buffer && !lost[workerKey{d.Component, d.Index}] {
			t.Errorf("displaced %s %d, which was not on %s", d.Component, d.Index, victim)
		}
	}
	old := map[workerKey]Worker{}
	for _, w := range first.Workers {
		old[workerKey{w.Component, w.Index}] = w
	}
	for _, w := range next.Workers {
		k := workerKey{w.Component, w.Index}
		if o := old[k]; !lost[k] && w.Component != Buffer && (o.NodeID != w.NodeID || !equalInts(o.GPUs, w.GPUs)) {
			t.Errorf("%s %d moved from %s%v to %s%v", w.Component, w.Index, o.NodeID, o.GPUs, w.NodeID, w.GPUs)
		}
	}
	if next.Moved == 0 || next.Moved > len(lost)+1 {
		t.Errorf("moved %d, want 1..%d", next.Moved, len(lost)+1)
	}
	if got := ch.Summary(); !strings.Contains(got, WhyNodeLeft+" "+victim) {
		t.Errorf("summary %q does not name %s", got, victim)
	}

	// The node coming back moves nobody.
	back, ch, err := Replan(next, spec, nodes)
	if err != nil || ch.Fresh || len(ch.Displaced) != 0 || back.Moved != 0 {
		t.Fatalf("node back: err %v, change %+v, moved %d", err, ch, back.Moved)
	}
	if !reflect.DeepEqual(back.Workers, next.Workers) {
		t.Errorf("node back changed the workers")
	}
}

func TestReplanUnhealthyGPU(t *testing.T) {
	spec := mustSpec(t, stickySpec)
	nodes := uniformNodes(6, 8, 32)
	first, _, _ := Replan(nil, spec, nodes)
	w := first.Workers[0]
	sick := append([]Node(nil), nodes...)
	for i := range sick {
		if sick[i].ID == w.NodeID {
			sick[i].Unhealthy = []int{w.GPUs[0]}
		}
	}
	next, ch, err := Replan(first, spec, sick)
	if err != nil || ch.Fresh {
		t.Fatalf("err %v, change %+v", err, ch)
	}
	checkSticky(t, spec, sick, next)
	if len(ch.Displaced) != 1 || ch.Displaced[0].Index != w.Index || !strings.HasPrefix(ch.Displaced[0].Why, WhyUnhealthy) {
		t.Errorf("displaced %+v, want only %s %d for %s", ch.Displaced, w.Component, w.Index, WhyUnhealthy)
	}
	// The worker may land on a node new to train, which then gets a
	// buffer worker of its own: that counts as a second move.
	if next.Moved < 1 || next.Moved > 2 {
		t.Errorf("moved %d, want 1 or 2", next.Moved)
	}
}

func TestReplanFallsBack(t *testing.T) {
	spec := mustSpec(t, stickySpec)
	nodes := uniformNodes(6, 8, 32)
	first, _, _ := Replan(nil, spec, nodes)
	colo := mustSpec(t, strings.Replace(stickySpec, "disaggregate", "colocate", 1))
	tests := []struct {
		name  string
		prev  *Plan
		spec  *Spec
		nodes []Node
		why   string
		valid bool
	}{
		{"invalid previous", &Plan{Valid: false}, spec, nodes, "the previous plan was not valid", true},
		{"placement changed", first, colo, nodes, "placement changed", true},
		{"cannot place", first, spec, nodes[:2], "sticky replan could not place", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ch, err := Replan(tt.prev, tt.spec, tt.nodes)
			if !ch.Fresh || !strings.HasPrefix(ch.FreshWhy, tt.why) {
				t.Errorf("change %+v, want fresh because %q", ch, tt.why)
			}
			if p.Valid != tt.valid || (err == nil) != tt.valid {
				t.Errorf("valid %v err %v, want valid %v", p.Valid, err, tt.valid)
			}
		})
	}
}

// checkSticky asserts the invariants every valid plan keeps, fresh or
// sticky: every worker placed once, on healthy GPUs of a node that has
// them, within each GPU's capacity and the strategy's sharing rules and
// each node's CPUs; pools describe exactly where the workers are.
// fataler is what checkSticky needs of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func checkSticky(t fataler, spec *Spec, nodes []Node, p *Plan) {
	t.Helper()
	if errs := checkPlan(spec, nodes, p); len(errs) > 0 {
		t.Fatalf("invariants: %s", strings.Join(errs, "; "))
	}
	if !p.Valid {
		t.Fatalf("plan not valid: %s", p.Error)
	}
	byID := map[string]*Node{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	want := map[Component]int{}
	sc := spec.Scheduling
	if sc.Train != nil {
		want[Train] = sc.Train.WorkerNum
	}
	if sc.Eval != nil {
		want[Eval] = sc.Eval.WorkerNum
	}
	for _, g := range sc.Env {
		want[Env] += g.WorkerNum
	}
	got := map[Component]map[int]bool{}
	share := map[string]map[Component][]float64{}
	cpus := map[string]float64{}
	held := map[string]map[Component]map[int]bool{} // pool/node -> comp -> gpus
	for _, w := range p.Workers {
		if got[w.Component] == nil {
			got[w.Component] = map[int]bool{}
		}
		if got[w.Component][w.Index] {
			t.Fatalf("%s %d placed twice", w.Component, w.Index)
		}
		got[w.Component][w.Index] = true
		n := byID[w.NodeID]
		if n == nil {
			t.Fatalf("%s %d on unknown node %s", w.Component, w.Index, w.NodeID)
		}
		cpus[n.ID] += w.CPUs
		if share[n.ID] == nil {
			share[n.ID] = map[Component][]float64{}
		}
		if share[n.ID][w.Component] == nil {
			share[n.ID][w.Component] = make([]float64, n.GPUs)
		}
		key := w.Pool + "/" + w.NodeID
		if held[key] == nil {
			held[key] = map[Component]map[int]bool{}
		}
		if held[key][w.Component] == nil {
			held[key][w.Component] = map[int]bool{}
		}
		for i, g := range w.GPUs {
			if g < 0 || g >= n.GPUs || !n.Healthy(g) {
				t.Fatalf("%s %d on GPU %s:%d, which is missing or unhealthy", w.Component, w.Index, n.ID, g)
			}
			if len(w.GPUUUIDs) > 0 && w.GPUUUIDs[i] != n.GPUUUIDs[g] {
				t.Fatalf("%s %d: uuid %s for %s:%d, node has %s", w.Component, w.Index, w.GPUUUIDs[i], n.ID, g, n.GPUUUIDs[g])
			}
			share[n.ID][w.Component][g] += w.GPUShare
			held[key][w.Component][g] = true
		}
	}
	for c, n := range want {
		if len(got[c]) != n {
			t.Fatalf("%s: %d workers placed, want %d", c, len(got[c]), n)
		}
	}
	for id, cs := range share {
		if cpus[id] > byID[id].CPUs+eps {
			t.Fatalf("node %s: %v CPUs used of %v", id, cpus[id], byID[id].CPUs)
		}
		for c, s := range cs {
			for g, x := range s {
				if x > 1+eps {
					t.Fatalf("%s:%d holds %v of %s", id, g, x, c)
				}
				for c2, s2 := range cs {
					if c2 == c || c == Buffer || c2 == Buffer || x <= eps || s2[g] <= eps {
						continue
					}
					trainPair := c == Train || c2 == Train
					if trainPair && spec.Placement.Strategy != StrategyColocate {
						t.Fatalf("%s:%d shared by %s and %s under disaggregate", id, g, c, c2)
					}
					if !trainPair && spec.Placement.EnvStrategy != EnvStrategyDeviceColocate {
						t.Fatalf("%s:%d shared by %s and %s without device-colocate", id, g, c, c2)
					}
				}
			}
		}
	}
	inPools := map[string]bool{}
	for _, pl := range p.Pools {
		for _, pn := range pl.Nodes {
			key := pl.Name + "/" + pn.NodeID
			inPools[key] = true
			for _, c := range gpuComponents {
				var gpus []int
				for _, r := range pn.Allocations[c] {
					for g := r.First; g <= r.Last; g++ {
						gpus = append(gpus, g)
					}
				}
				if len(gpus) != len(held[key][c]) {
					t.Fatalf("%s %s allocation %v, workers hold %v", key, c, pn.Allocations[c], held[key][c])
				}
				for _, g := range gpus {
					if !held[key][c][g] {
						t.Fatalf("%s %s allocation %v, workers hold %v", key, c, pn.Allocations[c], held[key][c])
					}
				}
			}
		}
	}
	for key := range held {
		if !inPools[key] {
			t.Fatalf("workers on %s, which no pool lists", key)
		}
	}
}

func genStickyNodes(t *rapid.T, label string, n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		gpus := rapid.SampledFrom([]int{0, 2, 4, 8}).Draw(t, fmt.Sprintf("%s%d.gpus", label, i))
		nodes[i] = uniformNodes(1, gpus, float64(rapid.IntRange(2, 48).Draw(t, fmt.Sprintf("%s%d.cpus", label, i))))[0]
		nodes[i].ID = fmt.Sprintf("%s%d", label, i)
		for g := range nodes[i].GPUUUIDs {
			nodes[i].GPUUUIDs[g] = fmt.Sprintf("GPU-%s-%d", nodes[i].ID, g)
		}
	}
	return nodes
}

func genStickySpec(t *rapid.T) *Spec {
	s := &Spec{Placement: Placement{
		Mode:        ModeAuto,
		Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy"),
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, "env_strategy"),
	}}
	s.Scheduling.Train = &WorkerGroup{WorkerNum: rapid.IntRange(0, 8).Draw(t, "train"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{0.5, 1, 2}).Draw(t, "train.gpus")}
	s.Scheduling.Eval = &WorkerGroup{WorkerNum: rapid.IntRange(0, 3).Draw(t, "eval"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{1, 2, 4}).Draw(t, "eval.gpus")}
	for i := range rapid.IntRange(0, 2).Draw(t, "env.groups") {
		s.Scheduling.Env = append(s.Scheduling.Env, WorkerGroup{WorkerNum: rapid.IntRange(1, 8).Draw(t, fmt.Sprintf("env%d", i)),
			NumCPUs: 1, NumGPUs: rapid.SampledFrom([]float64{0.25, 0.5, 1}).Draw(t, fmt.Sprintf("env%d.gpus", i))})
	}
	if rapid.Bool().Draw(t, "buffer") {
		s.Scheduling.Buffer = &WorkerGroup{Auto: true, NumCPUs: 1}
	}
	return s
}

// TestReplanProperties: a sticky plan keeps the invariants of a fresh one,
// is valid whenever a fresh plan is, moves only displaced workers, and a
// node joining moves nobody.
func TestReplanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genStickySpec(t)
		nodes := genStickyNodes(t, "n", rapid.IntRange(1, 6).Draw(t, "nodes"))
		prev, err := Compute(spec, nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		checkSticky(t, spec, nodes, prev)

		// A node joins: nobody moves.
		joined := append(append([]Node(nil), nodes...), genStickyNodes(t, "j", 1)...)
		p, ch, err := Replan(prev, spec, joined)
		if err != nil || ch.Fresh || p.Moved != 0 || !reflect.DeepEqual(p.Workers, prev.Workers) {
			t.Fatalf("join: err %v change %+v moved %d", err, ch, p.Moved)
		}
		checkSticky(t, spec, joined, p)

		// The inventory changes: a node leaves, a GPU fails, CPUs shrink.
		after := append([]Node(nil), nodes...)
		touched := map[string]bool{}
		for i := range rapid.IntRange(1, 3).Draw(t, "changes") {
			k := rapid.IntRange(0, len(after)-1).Draw(t, fmt.Sprintf("change%d.node", i))
			touched[after[k].ID] = true
			switch rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("change%d.kind", i)) {
			case 0:
				after = append(after[:k:k], after[k+1:]...)
			case 1:
				if after[k].GPUs > 0 {
					after[k].Unhealthy = []int{rapid.IntRange(0, after[k].GPUs-1).Draw(t, fmt.Sprintf("change%d.gpu", i))}
				}
			case 2:
				after[k].CPUs = math.Floor(after[k].CPUs / 2)
			}
			if len(after) == 0 {
				t.Skip("no nodes left")
			}
		}
		p, ch, err = Replan(prev, spec, after)
		_, freshErr := Compute(spec, after)
		if freshErr == nil && err != nil {
			t.Fatalf("fresh plan valid but replan not: %v", err)
		}
		if err != nil {
			return
		}
		checkSticky(t, spec, after, p)
		if ch.Fresh {
			return
		}
		old := map[workerKey]Worker{}
		for _, w := range prev.Workers {
			old[workerKey{w.Component, w.Index}] = w
		}
		for _, w := range p.Workers {
			o := old[workerKey{w.Component, w.Index}]
			if w.Component != Buffer && !touched[o.NodeID] && (o.NodeID != w.NodeID || !equalInts(o.GPUs, w.GPUs)) {
				t.Fatalf("%s %d moved off untouched node %s", w.Component, w.Index, o.NodeID)
			}
		}
	})
}
