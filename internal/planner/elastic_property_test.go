package planner

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// genElasticSpec is a spec with a fixed train group and an elastic eval
// (and sometimes an elastic last env entry), or now and then all fixed.
func genElasticSpec(t *rapid.T, name string) *Spec {
	s := &Spec{Priority: rapid.IntRange(0, 2).Draw(t, name+"Priority")}
	tr := WorkerGroup{WorkerNum: rapid.IntRange(0, 6).Draw(t, name+"Train"), NumCPUs: 1, NumGPUs: 1}
	s.Scheduling.Train = &tr
	lo := rapid.IntRange(1, 4).Draw(t, name+"EvalMin")
	ev := WorkerGroup{NumCPUs: 1, NumGPUs: rapid.SampledFrom([]float64{1, 1, 0.5, 2}).Draw(t, name+"EvalGPUs")}
	if rapid.IntRange(0, 4).Draw(t, name+"EvalFixed") == 0 {
		ev.WorkerNum = lo
	} else {
		ev.Min, ev.Max, ev.WorkerNum = lo, lo+rapid.IntRange(0, 12).Draw(t, name+"EvalRoom"), lo
	}
	s.Scheduling.Eval = &ev
	if rapid.Bool().Draw(t, name+"Env") {
		lo := rapid.IntRange(1, 3).Draw(t, name+"EnvMin")
		s.Scheduling.Env = []WorkerGroup{{WorkerNum: lo, Min: lo, Max: lo + rapid.IntRange(0, 6).Draw(t, name+"EnvRoom"), NumCPUs: 1,
			NumGPUs: rapid.SampledFrom([]float64{0.25, 1}).Draw(t, name+"EnvGPUs")}}
	}
	if rapid.IntRange(0, 5).Draw(t, name+"Quota") == 0 {
		s.MaxGPUs = rapid.IntRange(4, 24).Draw(t, name+"MaxGPUs")
	}
	s.Placement = Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate,
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, name+"EnvStrategy")}
	return s
}

// minimums is jobs with every elastic group at its minimum and no
// previous plan: what "a fresh plan of all plans' minimums" is made of.
func minimums(jobs []Job) []Job {
	out := make([]Job, len(jobs))
	for i, j := range jobs {
		refs := elasticRefs(j.Spec)
		lo := make([]int, len(refs))
		for k, r := range refs {
			lo[k] = r.min
		}
		out[i] = Job{Name: j.Name, Spec: sized(j.Spec, lo), Age: j.Age}
	}
	return out
}

// TestElasticProperties: over random clusters, elastic and fixed plans
// of random priorities, and random sequences of plans arriving,
// changing and leaving and nodes leaving and returning: no GPU is held
// by two plans; every placed plan holds the planner's invariants on the
// spec it was sized to, and its elastic groups within their range, with
// dense indices; whenever a fresh plan of every plan's minimum exists,
// every plan is valid that the fixed core places with every elastic
// group at its minimum (from the same previous plans: the core never
// moves a plan of equal priority to make room, elastic or not); a plan that
// grew moved no placed worker; the same events give the same plans; and
// planning again on a quiet cluster changes nothing.
func TestElasticProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := &shareWorld{jobs: map[string]*Job{}, last: map[string]*Plan{}}
		for i := range rapid.IntRange(1, 5).Draw(t, "nodes") {
			w.nodes = append(w.nodes, Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{4, 8}).Draw(t, "gpus")})
		}
		var gone []Node
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			nodeChanged, changed := false, ""
			switch rapid.IntRange(0, 4).Draw(t, "change") {
			case 0, 1: // a plan arrives or its spec changes
				name := fmt.Sprintf("j%d", rapid.IntRange(0, 3).Draw(t, "job"))
				if w.jobs[name] == nil {
					w.age++
					w.jobs[name] = &Job{Name: name, Age: w.age}
				}
				w.jobs[name].Spec, changed = genElasticSpec(t, name), name
			case 2: // a plan leaves
				if names := slices.Sorted(maps.Keys(w.jobs)); len(names) > 0 {
					name := rapid.SampledFrom(names).Draw(t, "gone")
					delete(w.jobs, name)
					delete(w.last, name)
				}
			case 3: // a node is lost
				if len(w.nodes) > 0 {
					i := rapid.IntRange(0, len(w.nodes)-1).Draw(t, "lost")
					gone = append(gone, w.nodes[i])
					w.nodes = slices.Delete(slices.Clone(w.nodes), i, i+1)
					nodeChanged = true
				}
			default: // a lost node returns
				if len(gone) > 0 {
					w.nodes = append(slices.Clip(w.nodes), gone[len(gone)-1])
					gone = gone[:len(gone)-1]
					nodeChanged = true
				}
			}
			names := slices.Sorted(maps.Keys(w.jobs))
			jobs := make([]Job, len(names))
			for i, n := range names {
				jobs[i] = *w.jobs[n]
				jobs[i].Prev = w.last[n]
			}
			out := PlanAll(jobs, w.nodes)
			checkElasticWorld(t, w.nodes, jobs, out, nodeChanged, changed)
			for j, o := range PlanAll(jobs, w.nodes) {
				if !SamePlacement(out[j].Plan, o.Plan) {
					t.Fatalf("%s: the same events planned twice differ", jobs[j].Name)
				}
			}
			// Quiet: planned again on what it published, nothing changes.
			// (Where a plan is degraded, the core's rules for it, which
			// place its unplaced workers in later runs, are its own.)
			if slices.ContainsFunc(out, func(o Outcome) bool { return o.Plan.PlanState() == plan.StateDegraded }) {
				for i, n := range names {
					w.last[n] = out[i].Plan
				}
				continue
			}
			quiet := slices.Clone(jobs)
			for j := range quiet {
				quiet[j].Prev = out[j].Plan
			}
			again := PlanAll(quiet, w.nodes)
			// A plan that shrank may, once, grow back onto GPUs its shrink
			// gave up that no plan took (the search over-shrank: the
			// service does so after --grow-after); then it is quiet.
			settled := slices.Clone(quiet)
			for j := range settled {
				settled[j].Prev = again[j].Plan
			}
			for j, o := range PlanAll(settled, w.nodes) {
				if again[j].Plan.PendingSpec == nil && !SamePlacement(again[j].Plan, o.Plan) {
					t.Fatalf("%s: no quiet after a grow back: %+v", jobs[j].Name, o.Plan.Status)
				}
			}
			grewBack := func(j int) bool {
				return out[j].Plan.Status.Reason == plan.ReasonShrunk && again[j].Plan.Status.Reason == plan.ReasonGrew && keptWorkers(out[j].Plan, again[j].Plan)
			}
			regrew := false
			for j := range again {
				regrew = regrew || grewBack(j)
			}
			for j, o := range again {
				if grewBack(j) {
					continue
				}
				// A plan that places nothing says how much room is left
				// ("available N"): a grow back takes some, and its words
				// follow, once, as they would on the service's next
				// revision, the grow's. Only its words may differ.
				if regrew && !out[j].Plan.Placed() {
					words := *o.Plan
					words.Error, words.Status.Cause = out[j].Plan.Error, out[j].Plan.Status.Cause
					if SamePlacement(out[j].Plan, &words) && slices.Equal(out[j].Plan.PreemptedBy, o.Plan.PreemptedBy) {
						continue
					}
				}
				// A pending spec's reason counts the room of plans of its
				// priority placed after it as it was going in (PlanAll):
				// the core's, elastic or not.
				if out[j].Plan.PendingSpec != nil {
					continue
				}
				if !SamePlacement(out[j].Plan, o.Plan) {
					for i := range jobs {
						t.Logf("%s prio %d age %d eval %+v env %+v quota %d\n  prev %s %s\n  out  %s %s", jobs[i].Name, jobs[i].Spec.Priority, jobs[i].Age, *jobs[i].Spec.Scheduling.Eval, jobs[i].Spec.Scheduling.Env, jobs[i].Spec.MaxGPUs, placementOf(jobs[i].Prev), stateOf(jobs[i].Prev), placementOf(out[i].Plan), stateOf(out[i].Plan))
					}
					t.Fatalf("%s: a quiet cluster replanned: %s %+v pending %v (was %v)\n  was %s\n  now %s", jobs[j].Name, o.Plan.PlanState(), o.Plan.Status, o.Plan.PendingSpec, out[j].Plan.PendingSpec, placementOf(out[j].Plan), placementOf(o.Plan))
				}
			}
			for i, n := range names {
				w.last[n] = out[i].Plan
			}
		}
	})
}

func checkElasticWorld(t *rapid.T, nodes []Node, jobs []Job, out []Outcome, nodeChanged bool, changed string) {
	owner := map[string]string{}
	for j, o := range out {
		job := &jobs[j]
		if !o.Plan.Placed() {
			continue
		}
		spec := o.Plan.spec
		if errs := checkPlan(spec, nodes, o.Plan); len(errs) > 0 {
			t.Fatalf("%s: %v", job.Name, errs)
		}
		EachHeldGPU(o.Plan, func(node string, g int) {
			k := fmt.Sprintf("%s:%d", node, g)
			if other, ok := owner[k]; ok && other != job.Name {
				t.Fatalf("GPU %s held by %s and %s", k, other, job.Name)
			}
			owner[k] = job.Name
		})
		if o.Plan.PendingSpec == nil {
			counts := heldCounts(o.Plan, elasticRefs(job.Spec))
			for k, r := range elasticRefs(job.Spec) {
				if counts[k] < r.min || counts[k] > r.max {
					t.Fatalf("%s: %s holds %d, outside %d..%d", job.Name, r, counts[k], r.min, r.max)
				}
			}
		}
		if o.Plan.Valid() {
			seen := map[plan.Component][]int{}
			for _, wk := range o.Plan.Workers.All() {
				seen[wk.Component] = append(seen[wk.Component], wk.Index)
			}
			for c, idx := range seen {
				slices.Sort(idx)
				for i, x := range idx {
					if x != i {
						t.Fatalf("%s: %s indices %v are not 0..%d", job.Name, c, idx, len(idx)-1)
					}
				}
			}
		}
		if st := o.Plan.Status; st.Reason == plan.ReasonGrew && !nodeChanged && job.Name != changed && job.Prev != nil && job.Prev.Valid() && job.Prev.PendingSpec == nil && len(o.Change.Displaced) == 0 && !o.Change.Fresh && len(o.Plan.PreemptedBy) == 0 && !keptElastic(job.Prev, o.Plan) {
			t.Fatalf("%s grew and moved a placed worker:\n  was %s\n  now %s", job.Name, placementOf(job.Prev), placementOf(o.Plan))
		}
	}
	if len(jobs) == 0 {
		return
	}
	for _, m := range planFixed(minimums(jobs), nodes) {
		if !m.Plan.Valid() {
			return // no fresh plan of every minimum
		}
	}
	// What the fixed core makes of every elastic group at its minimum,
	// from the same previous plans: a plan invalid there is so for
	// reasons of the core's (a plan of equal priority is never moved
	// to make room), not of elasticity.
	el := &elastic{jobs: jobs, nodes: nodes, refs: make([][]elasticRef, len(jobs))}
	floor := make([][]int, len(jobs))
	for j := range jobs {
		el.refs[j] = elasticRefs(jobs[j].Spec)
		for _, r := range el.refs[j] {
			floor[j] = append(floor[j], r.min)
		}
	}
	base := el.run(floor)
	for j, o := range out {
		if !o.Plan.Valid() && base[j].Plan.Valid() {
			for i := range jobs {
				t.Logf("%s prio %d spec eval %+v env %+v quota %d\n  prev %s\n  now  %s (%s)", jobs[i].Name, jobs[i].Spec.Priority, *jobs[i].Spec.Scheduling.Eval, jobs[i].Spec.Scheduling.Env, jobs[i].Spec.MaxGPUs, placementOf(jobs[i].Prev), placementOf(out[i].Plan), out[i].Plan.Error)
			}
			t.Fatalf("%s is %s (%s) though every minimum fits afresh", jobs[j].Name, o.Plan.PlanState(), o.Plan.Error)
		}
	}
}

// keptElastic reports whether b places every eval and env worker of a
// where a has it.
func keptElastic(a, b *Plan) bool {
	for _, w := range a.Workers.All() {
		if w.Component != plan.Eval && w.Component != plan.Env {
			continue
		}
		if o := b.Workers.Find(w.Component, w.Index); o == nil || !samePlace(w, o) {
			return false
		}
	}
	return true
}

func stateOf(p *Plan) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("%s unplaced %v", p.PlanState(), p.Unplaced)
}
