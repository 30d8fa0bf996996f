package planner

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestElasticLargeAgrees: on clusters of 8 to 200 nodes, a plan whose
// elastic eval fills what its train leaves, shrunk by plans of higher
// priority that arrive (the benchmark's shrink), grown again when they
// leave, and nodes lost and joining: PlanAllWith, which cuts and grows
// plans from their states and shares their holdings, gives every plan
// the very document (JSON, notes included, but for its explanations,
// below), change (its displaced workers in any order) and error it gives
// when every trial reads every worker again (readAll); and the holding
// each plan keeps is what a scan of its workers and pools says. (Both
// differ on main already: their explanations differ (one says of a
// grown eval worker "new worker", the other not), and a plan lists its
// displaced workers eval before train where the other lists train
// first; left to their own issue. The notes agree since the run that
// reads every worker keeps those of the nodes the state's run keeps
// untouched, keepNotes: one grown from the documents lost a node's
// "held by plan t4, plan t5", and one cut from them its "node shared
// with another pool".)
func TestElasticLargeAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(8, 200).Draw(t, "nodes")
		nodes := make([]Node, n)
		for i := range nodes {
			nodes[i] = Node{ID: fmt.Sprintf("n%03d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{4, 8, 8}).Draw(t, "gpus")}
		}
		gpus := 8 * n
		train := rapid.IntRange(1, gpus/4).Draw(t, "train")
		lo := rapid.IntRange(1, gpus/4).Draw(t, "evalMin")
		a := Job{Name: "a", Age: 1, Spec: &Spec{
			Scheduling: Scheduling{
				Train: &WorkerGroup{WorkerNum: train, NumCPUs: 1, NumGPUs: 1},
				Eval:  &WorkerGroup{WorkerNum: lo, Min: lo, Max: gpus, NumCPUs: 1, NumGPUs: 1},
			},
			Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
		}}
		jobs := []Job{a}
		next, age := n, uint64(2)
		for step := range rapid.IntRange(1, 8).Draw(t, "steps") {
			switch rapid.IntRange(0, 4).Draw(t, "change") {
			case 0, 1: // a plan of higher priority arrives: a shrinks for it
				age++
				jobs = append(jobs, Job{Name: fmt.Sprintf("t%d", age), Age: age, Spec: &Spec{Priority: 10,
					Scheduling: Scheduling{Train: &WorkerGroup{WorkerNum: rapid.IntRange(1, gpus/8).Draw(t, "taker"), NumCPUs: 1, NumGPUs: 1}},
					Placement:  Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}})
			case 2: // one leaves: a grows back
				if len(jobs) > 1 {
					jobs = slices.Delete(slices.Clone(jobs), 1, 2)
				}
			case 3: // a node is lost
				if len(nodes) > 1 {
					i := rapid.IntRange(0, len(nodes)-1).Draw(t, "lost")
					nodes = slices.Delete(slices.Clone(nodes), i, i+1)
				}
			default: // a node joins
				nodes = append(slices.Clone(nodes), Node{ID: fmt.Sprintf("n%03d", next), IP: "10.0.0.1", CPUs: 64, GPUs: 8})
				next++
			}
			out := PlanAllWith(jobs, nodes, ElasticOptions{})
			want := PlanAllWith(jobs, nodes, ElasticOptions{readAll: true})
			for j := range out {
				got, exp := outcomeJSON(t, out[j]), outcomeJSON(t, want[j])
				if got != exp {
					t.Fatalf("step %d: %s: from the run's states\n%s\nfrom the documents\n%s", step, jobs[j].Name, got, exp)
				}
				if p := out[j].Plan; p.Placed() {
					if h, want := newAllocator(jobs, nodes).holdingOf(p), denseRef(nodes, scanHeld(p)); !h.equal(want) {
						t.Fatalf("step %d: %s: holding\n%v\nwant\n%v", step, jobs[j].Name, h, want)
					}
				}
			}
			for j := range jobs {
				jobs[j].Prev = out[j].Plan
			}
		}
	})
}

// outcomeJSON is o's plan (but for its explanations), change (its
// displaced workers by component and index) and error as one JSON text.
func outcomeJSON(t *rapid.T, o Outcome) string {
	errText := ""
	if o.Err != nil {
		errText = o.Err.Error()
	}
	p := *o.Plan
	p.Explanations = nil
	var ch *Change
	if o.Change != nil {
		c := *o.Change
		c.Displaced = slices.Clone(c.Displaced)
		slices.SortStableFunc(c.Displaced, func(x, y Displaced) int {
			return cmp.Or(cmp.Compare(x.Component.Rank(), y.Component.Rank()), cmp.Compare(x.Index, y.Index))
		})
		ch = &c
	}
	b, err := json.Marshal(struct {
		Plan   *Plan
		Change *Change
		Err    string
	}{&p, ch, errText})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
