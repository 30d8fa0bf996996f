package planner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// elasticSpec is train fixed and eval {min, max}, one GPU each.
func elasticSpec(t *testing.T, train, lo, hi, priority int) *Spec {
	t.Helper()
	return specT(t, fmt.Sprintf("priority: %d\nscheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: {min: %d, max: %d}, num_cpus: 1, num_gpus: 1}\n", priority, train, lo, hi))
}

// countOf is how many workers of component c p places.
func countOf(p *Plan, c plan.Component) int {
	n := 0
	for _, w := range p.Workers.All() {
		if w.Component == c {
			n++
		}
	}
	return n
}

// placesOf is where p's workers of c are, by index.
func placesOf(p *Plan, c plan.Component) map[int]string {
	out := map[int]string{}
	for _, w := range p.Workers.All() {
		if w.Component == c {
			out[w.Index] = fmt.Sprintf("%s:%v", w.NodeID, w.GPUs)
		}
	}
	return out
}

func TestParseElastic(t *testing.T) {
	for _, tc := range []struct {
		name, spec, err string
		lo, hi          int
	}{
		{name: "eval range", spec: "scheduling:\n  eval: {worker_num: {min: 4, max: 32}, num_gpus: 1}\n", lo: 4, hi: 32},
		{name: "env last", spec: "scheduling:\n  env:\n    - {worker_num: 2, num_gpus: 1}\n    - {worker_num: {min: 1, max: 8}, num_gpus: 1}\n", lo: 1, hi: 8},
		{name: "equal bounds", spec: "scheduling:\n  eval: {worker_num: {min: 3, max: 3}, num_gpus: 1}\n", lo: 3, hi: 3},
		{name: "train", spec: "scheduling:\n  train: {worker_num: {min: 1, max: 2}, num_gpus: 1}\n", err: "scheduling.train.worker_num: a range {min, max} is allowed only for eval and env"},
		{name: "buffer", spec: "scheduling:\n  buffer: {worker_num: {min: 1, max: 2}}\n", err: "scheduling.buffer.worker_num: a range"},
		{name: "min above max", spec: "scheduling:\n  eval: {worker_num: {min: 5, max: 4}, num_gpus: 1}\n", err: "scheduling.eval.worker_num: min 5 is above max 4"},
		{name: "min zero", spec: "scheduling:\n  eval: {worker_num: {min: 0, max: 4}, num_gpus: 1}\n", err: "scheduling.eval.worker_num.min: 0 is not allowed"},
		{name: "max missing", spec: "scheduling:\n  eval: {worker_num: {min: 1}, num_gpus: 1}\n", err: "scheduling.eval.worker_num.max: missing"},
		{name: "fraction", spec: "scheduling:\n  eval: {worker_num: {min: 1.5, max: 4}, num_gpus: 1}\n", err: "scheduling.eval.worker_num.min: 1.5 is not allowed"},
		{name: "unknown key", spec: "scheduling:\n  eval: {worker_num: {min: 1, max: 4, step: 2}, num_gpus: 1}\n", err: `scheduling.eval.worker_num: unknown key "step"`},
		{name: "env not last", spec: "scheduling:\n  env:\n    - {worker_num: {min: 1, max: 8}, num_gpus: 1}\n    - {worker_num: 2, num_gpus: 1}\n", err: "scheduling.env[0].worker_num: only the last env entry"},
		{name: "manual", spec: "scheduling:\n  eval: {worker_num: {min: 1, max: 2}, num_gpus: 1}\nplacement: {mode: manual}\nresource_pool:\n  - {name: p, num_node: 1, num_gpus: 8, eval: \"0-1\"}\n", err: "scheduling.eval.worker_num: a range {min, max} needs placement.mode auto"},
		{name: "too many", spec: "scheduling:\n  eval: {worker_num: {min: 1, max: 3000000}, num_gpus: 1}\n", err: "scheduling.eval.worker_num.max: 3000000 is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tc.spec))
			if tc.err != "" {
				var fe *FieldError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &fe) {
					t.Fatalf("error %v, want a field error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			refs := elasticRefs(s)
			if len(refs) != 1 || refs[0].min != tc.lo || refs[0].max != tc.hi {
				t.Fatalf("refs %+v, want one %d..%d", refs, tc.lo, tc.hi)
			}
		})
	}
}

// TestElasticShareScenario is the story on the planner alone:
// 4x8 GPUs; a (train 8, eval 4..32) grows into all of it; b (priority
// 10, 12 GPUs) makes a shrink (train unmoved); the node of a's train dies
// and a heals from its eval surplus; b removed, a grows back.
func TestElasticShareScenario(t *testing.T) {
	nodes := shareNodes(4)
	a := Job{Name: "a", Spec: elasticSpec(t, 8, 4, 32, 0), Age: 1}
	out := planAll(t, []Job{a}, nodes)
	pa := out["a"].Plan
	if !pa.Valid() || countOf(pa, plan.Eval) != 24 || countOf(pa, plan.Train) != 8 {
		t.Fatalf("a alone: valid %v, eval %d, want 24: %v", pa.Valid(), countOf(pa, plan.Eval), out["a"].Err)
	}
	trainAt := placesOf(pa, plan.Train)

	a.Prev = pa
	b := Job{Name: "b", Spec: trainSpec(t, 12, 10, 0), Age: 2}
	out = planAll(t, []Job{a, b}, nodes)
	pa, pb := out["a"].Plan, out["b"].Plan
	if !pa.Valid() || !pb.Valid() || countOf(pa, plan.Eval) != 12 || len(pa.PreemptedBy) != 0 {
		t.Fatalf("with b: a valid %v eval %d preempted %v, b valid %v", pa.Valid(), countOf(pa, plan.Eval), pa.PreemptedBy, pb.Valid())
	}
	if st := pa.Status; st.Reason != plan.ReasonShrunk || !slices.Equal(st.By, []string{"b"}) || st.ResizeWords("a") != "shrank eval 24 -> 12 for plan b" {
		t.Fatalf("a's status %+v (%q)", st, st.ResizeWords("a"))
	}
	if !maps.Equal(placesOf(pa, plan.Train), trainAt) {
		t.Fatalf("a's train moved")
	}
	// Steady: the same again changes nothing.
	a.Prev, b.Prev = pa, pb
	again := planAll(t, []Job{a, b}, nodes)
	if !SamePlacement(pa, again["a"].Plan) || !SamePlacement(pb, again["b"].Plan) {
		t.Fatalf("a quiet cluster replanned: a %+v", again["a"].Plan.Status)
	}

	// The node of a's train goes.
	var trainNode string
	for _, w := range pa.Workers.All() {
		if w.Component == plan.Train {
			trainNode = w.NodeID
		}
	}
	var left []Node
	for _, n := range nodes {
		if n.ID != trainNode {
			left = append(left, n)
		}
	}
	out = planAll(t, []Job{a, b}, left)
	pa, pb = out["a"].Plan, out["b"].Plan
	if !pa.Valid() || !pb.Valid() || countOf(pa, plan.Eval) != 4 || countOf(pa, plan.Train) != 8 || pb.Moved != 0 {
		t.Fatalf("after loss: a %s eval %d (%v), b valid %v moved %d", pa.PlanState(), countOf(pa, plan.Eval), out["a"].Err, pb.Valid(), pb.Moved)
	}
	if st := pa.Status; st.Reason != plan.ReasonShrunk || !slices.Equal(st.By, []string{"a"}) || st.ResizeWords("a") != "shrank eval 12 -> 4 to re-place its own workers" {
		t.Fatalf("healed status %+v", st)
	}

	// b removed: a grows back into what b held.
	a.Prev = pa
	out = planAll(t, []Job{a}, left)
	pa = out["a"].Plan
	if !pa.Valid() || countOf(pa, plan.Eval) != 16 || pa.Status.ResizeWords("a") != "grew eval 4 -> 16" {
		t.Fatalf("b gone: a eval %d, %q", countOf(pa, plan.Eval), pa.Status.ResizeWords("a"))
	}
}

// TestElasticRules: equal priorities grow one worker each in turn, a
// higher priority first, growth keeps to max_gpus, and a lower plan's
// minimum comes before a higher plan's surplus.
func TestElasticRules(t *testing.T) {
	evalOnly := func(lo, hi, priority, quota int) *Spec {
		q := ""
		if quota > 0 {
			q = fmt.Sprintf("max_gpus: %d\n", quota)
		}
		return specT(t, fmt.Sprintf("priority: %d\n%sscheduling:\n  eval: {worker_num: {min: %d, max: %d}, num_cpus: 1, num_gpus: 1}\n", priority, q, lo, hi))
	}
	for _, tc := range []struct {
		name  string
		nodes int
		jobs  []Job
		want  map[string]int // eval workers
	}{
		{name: "equal priorities in turn", nodes: 2, jobs: []Job{
			{Name: "a", Spec: evalOnly(1, 32, 0, 0), Age: 1}, {Name: "b", Spec: evalOnly(1, 32, 0, 0), Age: 2}},
			want: map[string]int{"a": 8, "b": 8}},
		{name: "uneven room in turn", nodes: 2, jobs: []Job{
			{Name: "a", Spec: evalOnly(1, 3, 0, 0), Age: 1}, {Name: "b", Spec: evalOnly(1, 32, 0, 0), Age: 2}, {Name: "c", Spec: evalOnly(1, 32, 0, 0), Age: 3}},
			want: map[string]int{"a": 3, "b": 7, "c": 6}},
		{name: "higher first", nodes: 2, jobs: []Job{
			{Name: "a", Spec: evalOnly(1, 32, 0, 0), Age: 1}, {Name: "b", Spec: evalOnly(1, 12, 5, 0), Age: 2}},
			want: map[string]int{"a": 4, "b": 12}},
		{name: "max_gpus", nodes: 2, jobs: []Job{{Name: "a", Spec: evalOnly(1, 32, 0, 6), Age: 1}},
			want: map[string]int{"a": 6}},
		{name: "a lower minimum before a higher surplus", nodes: 2, jobs: []Job{
			{Name: "hi", Spec: evalOnly(2, 16, 5, 0), Age: 1}, {Name: "lo", Spec: evalOnly(6, 6, 0, 0), Age: 2}},
			want: map[string]int{"hi": 10, "lo": 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := planAll(t, tc.jobs, shareNodes(tc.nodes))
			for name, want := range tc.want {
				if o := out[name]; !o.Plan.Valid() || countOf(o.Plan, plan.Eval) != want {
					t.Errorf("%s: valid %v, eval %d, want %d (%v)", name, o.Plan.Valid(), countOf(o.Plan, plan.Eval), want, o.Err)
				}
			}
		})
	}
}

// TestElasticBeside: validation says what an elastic spec's minimum
// needs and what the cluster would give it now.
func TestElasticBeside(t *testing.T) {
	nodes := shareNodes(4)
	held := PlanAll([]Job{{Name: "b", Spec: trainSpec(t, 12, 10, 0)}}, nodes)[0].Plan
	doc, err := PlanBeside(elasticSpec(t, 8, 4, 32, 0), nodes, []Job{{Name: "b", Spec: trainSpec(t, 12, 10, 0), Prev: held}})
	if err != nil {
		t.Fatal(err)
	}
	want := "elastic: the minimum needs 12 GPUs in all; the cluster would give eval 12 of 4..32 now (20 GPUs)"
	if !slices.Contains(doc.Warnings, want) || countOf(doc, plan.Eval) != 12 {
		t.Fatalf("warnings %q, eval %d; want %q", doc.Warnings, countOf(doc, plan.Eval), want)
	}
}

// TestBesideGrownElastic: a validation beside an elastic plan grown past
// its minimum agrees with the replan, which gives the surplus up for a
// new plan: a (train 8, eval 4..32) grown to 24 eval on 4x8 GPUs leaves
// a new plan of its priority the 20 GPUs beyond a's minimum.
func TestBesideGrownElastic(t *testing.T) {
	nodes := shareNodes(4)
	aSpec := elasticSpec(t, 8, 4, 32, 0)
	grown := PlanAll([]Job{{Name: "a", Spec: aSpec}}, nodes)[0].Plan
	if countOf(grown, plan.Eval) != 24 {
		t.Fatalf("a alone: eval %d, want 24", countOf(grown, plan.Eval))
	}
	for _, tc := range []struct {
		train    int
		valid    bool
		evalThen int // a's eval once the replan places the new plan
		err      string
	}{
		{train: 12, valid: true, evalThen: 12},
		{train: 20, valid: true, evalThen: 4},
		{train: 21, err: "required 21.0, available 20"},
	} {
		t.Run(fmt.Sprint(tc.train), func(t *testing.T) {
			spec := trainSpec(t, tc.train, 0, 0)
			others := []Job{{Name: "a", Spec: aSpec, Prev: grown, Age: 1}}
			doc, err := PlanBeside(spec, nodes, others)
			if doc.Valid() != tc.valid || (err == nil) != tc.valid {
				t.Fatalf("beside: valid %v, err %v; want valid %v", doc.Valid(), err, tc.valid)
			}
			if !tc.valid && !strings.Contains(doc.Error, tc.err) {
				t.Fatalf("beside: error %q, want it to say %q", doc.Error, tc.err)
			}
			out := PlanAll(append(others, Job{Name: "new", Spec: spec, Age: 2}), nodes)
			if out[1].Plan.Valid() != tc.valid || !out[0].Plan.Valid() {
				t.Fatalf("replan: new valid %v (%v), a valid %v; beside said %v", out[1].Plan.Valid(), out[1].Err, out[0].Plan.Valid(), tc.valid)
			}
			if tc.valid && countOf(out[0].Plan, plan.Eval) != tc.evalThen {
				t.Fatalf("replan: a's eval %d, want %d", countOf(out[0].Plan, plan.Eval), tc.evalThen)
			}
		})
	}
}
