package planner

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// fromDocument is p as a restarted planner reads it: its document alone.
func fromDocument(t *testing.T, p *Plan) *Plan {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Plan
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	return &q
}

func restartSpec(train int, eval, env WorkerGroup, quota int) *Spec {
	s := &Spec{MaxGPUs: quota, Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}
	s.Scheduling.Train = &WorkerGroup{WorkerNum: train, NumCPUs: 1, NumGPUs: 1}
	s.Scheduling.Eval = &eval
	if env.WorkerNum > 0 {
		s.Scheduling.Env = []WorkerGroup{env}
	}
	return s
}

// TestRestartSeeds: cases TestRestartAgrees found, where a planner
// restarted on a plan's document (given the spec its placement follows,
// PrevSpec) published another plan than one that kept running.
func TestRestartSeeds(t *testing.T) {
	one := []Node{{ID: "n0", IP: "10.0.0.1", CPUs: 64, GPUs: 4}}
	evens := ElasticOptions{GrowInto: func(_ string, g int) bool { return g%2 == 0 }}
	for _, c := range []struct {
		name, seed string
		first      *Spec
		firstOpt   ElasticOptions
		next       *Spec
		opt        ElasticOptions
		want       string
	}{
		{
			// The spec in force for a spec pending is the stored one, its
			// range at its minimum: sized to what the document holds, not
			// cut back to it.
			name: "a grown plan's new spec pending keeps every worker", seed: "11431185382737150049",
			first:    restartSpec(0, WorkerGroup{WorkerNum: 1, Min: 1, Max: 2, NumCPUs: 1, NumGPUs: 1}, WorkerGroup{}, 0),
			firstOpt: evens,
			next:     restartSpec(0, WorkerGroup{WorkerNum: 4, NumCPUs: 1, NumGPUs: 1}, WorkerGroup{WorkerNum: 1, Min: 1, Max: 1, NumCPUs: 1, NumGPUs: 0.25}, 4),
			opt:      evens,
			want:     "eval0@n0[0]/1 eval1@n0[2]/1 ",
		},
		{
			// Sized to the new spec's sizes, the old spec kept in force
			// would place more workers: a growth on a pending spec.
			name: "a pending spec's old placement does not grow", seed: "13871354508289155121",
			first:    restartSpec(0, WorkerGroup{WorkerNum: 1, Min: 1, Max: 2, NumCPUs: 1, NumGPUs: 1}, WorkerGroup{WorkerNum: 1, Min: 1, Max: 1, NumCPUs: 1, NumGPUs: 0.25}, 0),
			firstOpt: ElasticOptions{NoGrow: true},
			next:     restartSpec(1, WorkerGroup{WorkerNum: 3, Min: 3, Max: 3, NumCPUs: 1, NumGPUs: 1}, WorkerGroup{WorkerNum: 1, Min: 1, Max: 1, NumCPUs: 1, NumGPUs: 0.25}, 4),
			opt:      evens,
			want:     "eval0@n0[0]/1 env0@n0[1]/1 ",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			prev := PlanAllWith([]Job{{Name: "a", Spec: c.first, Age: 1}}, one, c.firstOpt)[0].Plan
			mem := PlanAllWith([]Job{{Name: "a", Spec: c.next, Prev: prev, Age: 1}}, one, c.opt)[0]
			doc := PlanAllWith([]Job{{Name: "a", Spec: c.next, Prev: fromDocument(t, prev), PrevSpec: c.first, Age: 1}}, one, c.opt)[0]
			if mem.Plan.PendingSpec == nil {
				t.Fatalf("seed %s: the new spec is in force, want it pending", c.seed)
			}
			if got := placementOf(mem.Plan); got != c.want {
				t.Fatalf("seed %s: from the run's plan %q, want %q", c.seed, got, c.want)
			}
			if why := outcomesDiffer(mem, doc); why != "" {
				t.Fatalf("seed %s: from the run's plan and from the document, %s", c.seed, why)
			}
		})
	}
}

// TestAdoptedSpecFollows: a new spec that places as the old one did is
// not published (the service keeps its latest, WithRunOf the new run)
// where the document says the same of both specs (SameSpecFacts); the
// next run, a node lost, then starts from the new spec, as a planner
// restarted on the document does: degraded, no spec pending. Where the
// document says otherwise (another env_strategy), it is news: kept
// unpublished, the restarted planner would keep a worker on the node
// lost as it is, valid. (Seed 3323 of TestRestartAgrees.)
func TestAdoptedSpecFollows(t *testing.T) {
	nodes := []Node{{ID: "n0", IP: "10.0.0.1", CPUs: 64, GPUs: 4}, {ID: "n1", IP: "10.0.0.1", CPUs: 64, GPUs: 4}}
	old := restartSpec(0, WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}, WorkerGroup{}, 0)
	for _, c := range []struct {
		name string
		next func(s Spec) *Spec
		news bool
	}{
		{"a quota added", func(s Spec) *Spec { s.MaxGPUs = 4; return &s }, false},
		{"another env_strategy", func(s Spec) *Spec { s.Placement.EnvStrategy = EnvStrategyDeviceColocate; return &s }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p0 := PlanAll([]Job{{Name: "a", Spec: old, Age: 1}}, nodes)[0].Plan
			p1 := PlanAll([]Job{{Name: "a", Spec: old, Age: 1, Prev: p0}}, nodes[1:])[0].Plan
			spec := c.next(*old)
			p2 := PlanAll([]Job{{Name: "a", Spec: spec, Age: 1, Prev: p1}}, nodes[1:])[0].Plan
			if !SamePlacement(p1, p2) {
				t.Fatalf("the new spec moved the plan: %s -> %s", placementOf(p1), placementOf(p2))
			}
			if got := !SameSpecFacts(p1, p2); got != c.news {
				t.Fatalf("news %v, want %v", got, c.news)
			}
			latest := p2
			if !c.news {
				latest = p1.WithRunOf(p2)
			}
			mem := PlanAll([]Job{{Name: "a", Spec: spec, Age: 1, Prev: latest}}, nil)[0]
			doc := PlanAll([]Job{{Name: "a", Spec: spec, Age: 1, Prev: fromDocument(t, latest)}}, nil)[0]
			if mem.Plan.PlanState() != plan.StateDegraded || mem.Plan.PendingSpec != nil {
				t.Fatalf("node lost: %s, pending %v; want degraded on the new spec", mem.Plan.PlanState(), mem.Plan.PendingSpec)
			}
			if why := outcomesDiffer(mem, doc); why != "" {
				t.Fatalf("from the run's plan and from the document, %s", why)
			}
		})
	}
}

// TestDisplacedWordsInOrder: a revision's reason names the workers
// re-placed in one order, whatever order the run met them in (a planner
// that kept running meets a lost node's workers in its state's slot
// order, a restarted one in the document's).
func TestDisplacedWordsInOrder(t *testing.T) {
	a := &Change{Unplaced: []Displaced{{Component: plan.Eval, Index: 0, Why: WhyNodeLeft, Where: "n1"}, {Component: plan.Train, Index: 0, Why: WhyNodeLeft, Where: "n1"}}}
	b := &Change{Unplaced: []Displaced{{Component: plan.Train, Index: 0, Why: WhyNodeLeft, Where: "n1"}, {Component: plan.Eval, Index: 0, Why: WhyNodeLeft, Where: "n1"}}}
	const want = "2 workers unplaced (train 0: node left n1; eval 0: node left n1)"
	for _, c := range []*Change{a, b} {
		if got := c.Summary(); got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}

// outcomesDiffer says how a and b, one job's outcomes of two runs,
// differ in what the service publishes of them ("": they do not): the
// document, whether it is valid and why not, and the change its reason
// is worded from. Not the explanations and notes: a run from a plan's
// state keeps the notes of the nodes it does not touch (why.go: "pool
// shared" where a worker went long ago), one from the document makes
// every node's state anew and has only this run's. The document lists
// its notes, but not the node facts nor the spec constraints they were
// made on, which a run from the state drops them for when they change.
// Nor, for the same cause, the words of a plan made afresh after an
// incremental run fell short (FreshWhy): they name the nodes that run
// passed over, its notes among them ("held by plan a on n1" from a run
// before).
func outcomesDiffer(a, b Outcome) string {
	da, db := a.Plan.Document, b.Plan.Document
	da.Explanations, da.Notes, db.Explanations, db.Notes = nil, nil, nil, nil
	ja, err := da.MarshalJSON()
	if err != nil {
		return err.Error()
	}
	jb, err := db.MarshalJSON()
	if err != nil {
		return err.Error()
	}
	switch {
	case (a.Err == nil) != (b.Err == nil) || a.Err != nil && a.Err.Error() != b.Err.Error():
		return fmt.Sprintf("errors differ: %v; %v", a.Err, b.Err)
	case a.Plan.Valid() != b.Plan.Valid():
		return fmt.Sprintf("valid %v; %v", a.Plan.Valid(), b.Plan.Valid())
	case string(ja) != string(jb):
		return fmt.Sprintf("documents differ:\n  %s\n  %s", ja, jb)
	case (a.Change == nil) != (b.Change == nil):
		return fmt.Sprintf("changes differ: %+v; %+v", a.Change, b.Change)
	case a.Change != nil && (a.Change.Fresh != b.Change.Fresh || a.Change.FreshKind != b.Change.FreshKind || !a.Change.Fresh && a.Change.Summary() != b.Change.Summary()):
		// What the revision's reason says of it (the service's reason):
		// the workers in the order each path meets them may differ.
		return fmt.Sprintf("changes differ: %q %s; %q %s", a.Change.Summary(), a.Change.FreshKind, b.Change.Summary(), b.Change.FreshKind)
	}
	return ""
}
