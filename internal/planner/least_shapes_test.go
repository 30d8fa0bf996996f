package planner

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// leastGroup is a worker group of any share a spec may ask: a share of
// eps or less, thirds, whole GPUs and several.
func leastGroup(t *rapid.T, name string, maxW int) WorkerGroup {
	shares := []float64{0, 1e-10, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1.0 / 3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1, 2, 3, 4}
	return WorkerGroup{WorkerNum: rapid.IntRange(0, maxW).Draw(t, name+"W"), NumCPUs: float64(rapid.IntRange(0, 2).Draw(t, name+"C")), NumGPUs: rapid.SampledFrom(shares).Draw(t, name+"G")}
}

// leastSpec is a spec of leastGroup's groups, whole and fractional ones
// mixed in one component, with buffers, quotas, both strategies and env
// strategies, and elastic eval.
func leastSpec(t *rapid.T, name string) *Spec {
	s := &Spec{Priority: rapid.IntRange(0, 2).Draw(t, name+"P")}
	tr, ev := leastGroup(t, name+"tr", 6), leastGroup(t, name+"ev", 6)
	if rapid.Bool().Draw(t, name+"elastic") && ev.WorkerNum > 0 {
		ev.Min, ev.Max = ev.WorkerNum, ev.WorkerNum+rapid.IntRange(0, 8).Draw(t, name+"room")
	}
	s.Scheduling.Train, s.Scheduling.Eval = &tr, &ev
	for i := rapid.IntRange(0, 4).Draw(t, name+"envs"); i > 0; i-- {
		s.Scheduling.Env = append(s.Scheduling.Env, leastGroup(t, name+"env", 6))
	}
	if rapid.IntRange(0, 3).Draw(t, name+"buf") == 0 {
		s.Scheduling.Buffer = &WorkerGroup{WorkerNum: rapid.IntRange(1, 2).Draw(t, name+"bufW"), NumCPUs: 1, NumGPUs: rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(t, name+"bufG")}
	}
	if rapid.IntRange(0, 2).Draw(t, name+"quota") == 0 {
		s.MaxGPUs = rapid.IntRange(1, 16).Draw(t, name+"max")
	}
	s.Placement = Placement{Mode: ModeAuto,
		Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, name+"strat"),
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, name+"envstrat")}
	return s
}

// TestLeastGPUsBelowAnyShape (from review rev6): no valid plan, made
// fresh or by PlanAllWith beside another plan over a few runs (elastic,
// a spec changed), holds fewer GPUs than leastGPUs of its spec, over
// specs whose components mix whole and fractional workers, tiny shares
// included (genSpec makes neither).
func TestLeastGPUsBelowAnyShape(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var nodes []Node
		for i := range rapid.IntRange(1, 12).Draw(t, "nodes") {
			nodes = append(nodes, Node{ID: fmt.Sprintf("n%02d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "gpus")})
		}
		check := func(how string, spec *Spec, p *Plan) {
			if p != nil && p.Valid() && p.PendingSpec == nil {
				if HeldGPUs(p) < leastGPUs(spec) {
					t.Fatalf("%s: holds %d, leastGPUs %d: %s", how, HeldGPUs(p), leastGPUs(spec), placementOf(p))
				}
			}
		}
		s := leastSpec(t, "a")
		p, _ := Compute(s, nodes)
		check("fresh", s, p)
		jobs := []Job{{Name: "a", Age: 1, Spec: s}, {Name: "b", Age: 2, Spec: leastSpec(t, "b")}}
		for step := range 3 {
			out := PlanAllWith(jobs, nodes, ElasticOptions{})
			for j := range out {
				// The spec the plan was sized to: least of the job's
				// spec at its minimum (WorkerNum = Min) is what WithinQuota reads.
				check(fmt.Sprintf("step %d %s", step, jobs[j].Name), jobs[j].Spec, out[j].Plan)
				jobs[j].Prev = out[j].Plan
			}
			if step == 0 {
				jobs[1].Spec = leastSpec(t, "b2")
			}
		}
	})
}
