package planner

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// TestLeastGPUs: the least GPUs a spec's placement holds, per
// component and as components share GPUs, against the packing's count
// (required) where the two part.
func TestLeastGPUs(t *testing.T) {
	g := func(n int, gpus float64) WorkerGroup { return WorkerGroup{WorkerNum: n, NumCPUs: 1, NumGPUs: gpus} }
	spec := func(train, eval WorkerGroup, env []WorkerGroup, strategy, envStrategy string) *Spec {
		s := &Spec{Placement: Placement{Mode: ModeAuto, Strategy: strategy, EnvStrategy: envStrategy}}
		s.Scheduling.Train, s.Scheduling.Eval, s.Scheduling.Env = &train, &eval, env
		return s
	}
	dis := func(train, eval WorkerGroup, env ...WorkerGroup) *Spec {
		return spec(train, eval, env, StrategyDisaggregate, EnvStrategyDefault)
	}
	buffered := dis(g(2, 1), g(0, 1))
	buffered.Scheduling.Buffer = &WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}
	manual := dis(g(4, 1), g(0, 1))
	manual.Placement = Placement{Mode: ModeManual}
	for _, tc := range []struct {
		name     string
		spec     *Spec
		least    int
		required float64 // the packing's count (required), where it says more
	}{
		{"whole GPUs summed", dis(g(1, 1), g(4, 1), g(1, 0.25)), 6, 6},
		{"workers of several GPUs", dis(g(0, 1), g(2, 2), g(3, 1)), 7, 7},
		{"a share two fit on per GPU", dis(g(0, 1), g(0, 1), g(5, 0.4)), 3, 3},
		{"shares of several groups summed", dis(g(0, 1), g(0, 1), g(1, 0.6), g(1, 0.5), g(1, 0.4), g(1, 0.5)), 2, 3},
		{"tenths make one GPU", dis(g(0, 1), g(0, 1), g(10, 0.1)), 1, 1},
		{"no GPUs asked", dis(g(3, 0), g(2, 0), g(4, 0)), 0, 0},
		{"colocate: train beside rollout", spec(g(4, 1), g(2, 1), []WorkerGroup{g(1, 1)}, StrategyColocate, EnvStrategyDefault), 4, 4},
		{"colocate: rollout the larger", spec(g(1, 1), g(2, 1), []WorkerGroup{g(2, 1)}, StrategyColocate, EnvStrategyDefault), 4, 4},
		{"device-colocate: eval and env share", spec(g(1, 1), g(3, 1), []WorkerGroup{g(2, 1)}, StrategyDisaggregate, EnvStrategyDeviceColocate), 4, 4},
		{"a buffer's reserve not counted", buffered, 2, 3},
		{"manual: the user's ranges", manual, 0, 4},
		// fits lets a share of eps or less beside a whole-GPU worker of
		// its component (review rev6: counted a GPU of its own, 3, a
		// valid plan holding 2 within max_gpus 2 was refused).
		{"a share of eps or less rides along", dis(g(0, 1), g(0, 1), g(1, 2), g(1, 1e-10)), 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leastGPUs(tc.spec); got != tc.least {
				t.Fatalf("leastGPUs = %d, want %d", got, tc.least)
			}
			if got := newEngine(tc.spec, Options{}).required(); got != tc.required {
				t.Fatalf("required = %v, want %v", got, tc.required)
			}
		})
	}
}

// TestWithinQuotaBeforeRoom: a spec whose least count is over its quota
// is refused for its quota whether it was placed or failed for room, in
// the same words; one within it that its placement takes over is refused
// as placed, and one that fails for room keeps that reason.
func TestWithinQuotaBeforeRoom(t *testing.T) {
	over := quietSpec(1, 4, 0, 1, 1, 1, 0.25, 4, EnvStrategyDefault)  // 6 at the least
	buffered := quietSpec(2, 0, 0, 1, 0, 0, 0, 2, EnvStrategyDefault) // 2 at the least, 3 with the buffer's
	buffered.Scheduling.Buffer = &WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}
	within := quietSpec(1, 4, 0, 1, 1, 1, 0.25, 6, EnvStrategyDefault) // 6, quota 6
	room, none := uniformNodes(2, 4, 64), uniformNodes(1, 2, 64)
	for _, tc := range []struct {
		name   string
		spec   *Spec
		nodes  []Node
		reason plan.Reason
		msg    string
	}{
		{"over, room to place it", over, room, plan.ReasonQuota, "max_gpus: the plan needs 6 GPUs; its quota is 4"},
		{"over, no room", over, none, plan.ReasonQuota, "max_gpus: the plan needs 6 GPUs; its quota is 4"},
		{"over as placed", buffered, room, plan.ReasonQuota, "max_gpus: the plan needs 3 GPUs; its quota is 2"},
		{"within, no room", within, none, plan.ReasonSpec, "Insufficient GPUs: required 6.0, available 2"},
		{"within, placed", within, room, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := Compute(tc.spec, tc.nodes)
			o := WithinQuota(Outcome{Plan: doc, Err: err}, tc.spec)
			if tc.msg == "" {
				if o.Err != nil || !o.Plan.Valid() {
					t.Fatalf("refused: %v", o.Err)
				}
				return
			}
			if o.Err == nil || o.Plan.Placed() || o.Plan.Error != tc.msg || o.Plan.Status.Reason != tc.reason {
				t.Fatalf("%v, %s %+v %q; want refused (%s): %q", o.Err, o.Plan.PlanState(), o.Plan.Status, o.Plan.Error, tc.reason, tc.msg)
			}
		})
	}
}

// TestLeastGPUsBelowPlacements: over random specs (shares of several
// groups, colocation, device-colocate, buffers) and clusters, no valid
// placement holds fewer GPUs than leastGPUs says: fresh, incremental
// from another spec's plan, and after a node is lost. Were it ever more,
// a spec within its quota would be refused.
func TestLeastGPUsBelowPlacements(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := genNodes(t)
		spec := genSpec(t)
		least := leastGPUs(spec)
		check := func(how string, p *Plan) {
			if p.Valid() && HeldGPUs(p) < least {
				t.Fatalf("%s: the plan holds %d GPUs, leastGPUs says %d: %s", how, HeldGPUs(p), least, placementOf(p))
			}
		}
		p, _ := Compute(spec, nodes)
		check("fresh", p)
		other := genSpec(t)
		if prev, _ := Compute(other, nodes); prev.Valid() {
			q, _, _ := Replan(prev, spec, nodes)
			check("incremental from another spec", q)
		}
		if p.Valid() && len(nodes) > 1 {
			lost := rapid.IntRange(0, len(nodes)-1).Draw(t, "lost")
			q, _, _ := Replan(p, spec, append(nodes[:lost:lost], nodes[lost+1:]...))
			check("a node lost", q)
		}
	})
}
