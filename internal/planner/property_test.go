package planner

import (
	"encoding/json"
	"fmt"
	"github.com/poolplanner/poolplanner/plan"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

func genNodes(t *rapid.T) []Node {
	n := rapid.IntRange(1, 10).Draw(t, "nodes")
	nodes := make([]Node, n)
	for i := range nodes {
		g := rapid.SampledFrom([]int{0, 1, 2, 4, 8}).Draw(t, "gpus")
		nodes[i] = Node{
			ID:   fmt.Sprintf("n%02d", i),
			IP:   fmt.Sprintf("10.0.0.%d", i+1),
			CPUs: float64(rapid.SampledFrom([]int{2, 8, 32, 128}).Draw(t, "cpus")),
			GPUs: g,
		}
		if g > 0 && rapid.IntRange(0, 5).Draw(t, "sick") == 0 {
			nodes[i].Unhealthy = []int{rapid.IntRange(0, g-1).Draw(t, "sickGPU")}
		}
	}
	return nodes
}

func genGroup(t *rapid.T, name string, maxWorkers int, gpus []float64) WorkerGroup {
	return WorkerGroup{
		WorkerNum: rapid.IntRange(0, maxWorkers).Draw(t, name+"Workers"),
		NumCPUs:   float64(rapid.IntRange(0, 4).Draw(t, name+"CPUs")),
		NumGPUs:   rapid.SampledFrom(gpus).Draw(t, name+"GPUs"),
	}
}

func genSpec(t *rapid.T) *Spec {
	s := &Spec{}
	tr := genGroup(t, "train", 20, []float64{1, 1, 0.5, 2, 0})
	ev := genGroup(t, "eval", 10, []float64{1, 2, 4, 0.5, 0})
	s.Scheduling.Train, s.Scheduling.Eval = &tr, &ev
	if rapid.Bool().Draw(t, "buffer") {
		s.Scheduling.Buffer = &WorkerGroup{WorkerNum: 1, Auto: rapid.Bool().Draw(t, "auto"), NumCPUs: 1,
			NumGPUs: rapid.SampledFrom([]float64{0, 0, 1}).Draw(t, "bufferGPUs")}
	}
	for i := rapid.IntRange(0, 3).Draw(t, "envGroups"); i > 0; i-- {
		s.Scheduling.Env = append(s.Scheduling.Env, genGroup(t, "env", 16, []float64{0.25, 0.5, 1, 0.1, 0.3, 0}))
	}
	s.Placement = Placement{
		Mode:        ModeAuto,
		Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy"),
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, "envStrategy"),
	}
	return s
}

// TestPlanProperties: on random clusters and specs the planner never
// panics, every valid plan holds the invariants, validation agrees with
// planning, planning is deterministic, and the export loads back in manual
// mode to the same allocations.
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := genNodes(t)
		spec := genSpec(t)
		p, err := Compute(spec, nodes)
		if (err == nil) != p.Valid() {
			t.Fatalf("error %v but valid=%v", err, p.Valid())
		}
		if verr := Validate(spec, nodes); (verr == nil) != p.Valid() {
			t.Fatalf("validate says %v, plan valid=%v", verr, p.Valid())
		}
		if err != nil {
			if p.Error == "" {
				t.Fatalf("invalid plan without an error")
			}
			return
		}
		for _, e := range checkPlan(spec, nodes, p) {
			t.Error(e)
		}
		again, _ := Compute(spec, nodes)
		if !reflect.DeepEqual(again.Workers.Slice(), p.Workers.Slice()) {
			t.Fatalf("planning is not deterministic")
		}
		exportLoadsBack(t, spec, nodes, p)
	})
}

// exportLoadsBack: p's export loads back in manual mode to the same
// allocations and workers per node.
func exportLoadsBack(t interface {
	Fatalf(string, ...any)
	Error(...any)
}, spec *Spec, nodes []Node, p *Plan) {
	manual := *spec
	manual.Placement = Placement{Mode: ModeManual}
	rp, _ := json.Marshal(p.ResourcePool)
	var raw []any
	_ = json.Unmarshal(rp, &raw)
	pools, perr := parsePools(raw)
	if perr != nil {
		t.Fatalf("export does not parse: %v\n%s", perr, rp)
	}
	manual.ResourcePool = pools
	p2, err := Compute(&manual, nodes)
	if err != nil {
		t.Fatalf("export loaded in manual mode: %v\n%s", err, rp)
	}
	if fmt.Sprint(allocSet(p2)) != fmt.Sprint(allocSet(p)) || fmt.Sprint(countSet(p2)) != fmt.Sprint(countSet(p)) {
		t.Fatalf("export loaded in manual mode gives other allocations or workers per node\n%s", rp)
	}
	for _, e := range checkPlan(&manual, nodes, p2) {
		t.Error("manual: " + e)
	}
}

// TestRequiredMatchesPacking: when the GPU arithmetic passes on a cluster of
// one big node with CPUs to spare, the plan is valid: the arithmetic
// counts what the packing needs.
func TestRequiredMatchesPacking(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genSpec(t)
		spec.Placement.Strategy = StrategyDisaggregate
		b := newEngine(spec, Options{})
		need := int(b.required())
		nodes := []Node{{ID: "big", CPUs: 1e6, GPUs: max(need, 4)}}
		if _, err := Compute(spec, nodes); err != nil {
			t.Fatalf("required %d GPUs, one node of %d, yet: %v", need, nodes[0].GPUs, err)
		}
	})
}

func FuzzParseSpec(f *testing.F) {
	f.Add([]byte("scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\nplacement: {mode: auto}\n"))
	f.Add([]byte(`{"scheduling": {"env": [{"worker_num": 2, "num_gpus": 0.5}]}, "placement": {"mode": "manual"}, "resource_pool": [{"name": "p", "num_node": 1, "num_gpus": 8, "env": "0-1"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			return
		}
		nodes := []Node{{ID: "a", CPUs: 8, GPUs: 8}, {ID: "b", CPUs: 8, GPUs: 8}}
		p, _ := Compute(s, nodes)
		if p == nil {
			t.Fatal("nil plan")
		}
	})
}

func FuzzParseIndexString(f *testing.F) {
	for _, s := range []string{"0-7, 8-15", "5", "", "7-0", "1,,2", "a-b", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := plan.ParseIndexString(s)
		if err != nil {
			return
		}
		back, err := plan.ParseIndexString(plan.FormatRanges(rs))
		if err != nil || !reflect.DeepEqual(back, rs) {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, rs, plan.FormatRanges(rs), back, err)
		}
	})
}

// TestGPUsNeededClosedForm: the closed form counts what worker-by-worker
// next-fit packing counts.
func TestGPUsNeededClosedForm(t *testing.T) {
	naive := func(groups []WorkerGroup) int {
		n, room := 0, 0.0
		for _, g := range groups {
			for i := 0; i < g.WorkerNum; i++ {
				switch {
				case g.NumGPUs <= 0:
				case g.NumGPUs > 1:
					n += int(g.NumGPUs)
					room = 0
				default:
					if room+eps < g.NumGPUs {
						n++
						room = 1
					}
					room -= g.NumGPUs
				}
			}
		}
		return n
	}
	rapid.Check(t, func(t *rapid.T) {
		var groups []WorkerGroup
		for i := rapid.IntRange(1, 5).Draw(t, "groups"); i > 0; i-- {
			groups = append(groups, WorkerGroup{
				WorkerNum: rapid.IntRange(0, 50).Draw(t, "n"),
				NumGPUs:   rapid.SampledFrom([]float64{0, 0.1, 0.2, 0.25, 0.3, 1.0 / 3, 0.5, 0.7, 1, 2, 4}).Draw(t, "gpus"),
			})
		}
		if got, want := gpusNeeded(groups), naive(groups); got != want {
			t.Fatalf("gpusNeeded = %d, next-fit = %d", got, want)
		}
	})
}
