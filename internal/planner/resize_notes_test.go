package planner

import (
	"fmt"
	"slices"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestResizeKeepsNotes: a plan replanned at other elastic sizes keeps
// the notes of the nodes it does not touch, whether the run starts from
// the previous plan's state (adoptFast, resized) or reads every worker
// again (readAll: adoptSlow). The fresh plan passes over n1 and n2,
// whose GPUs plans t4 and t5 hold, before it fills train's node n0 (a
// node of another pool, so last); growing eval there, or cutting it
// back, leaves them as they were. Where the plan was read from its
// document, the notes were lost: TestElasticLargeAgrees saw a plan
// grown on the documents without the "held by plan t4, plan t5" of the
// nodes its eval could not use, which the same plan grown from its
// state says.
func TestResizeKeepsNotes(t *testing.T) {
	nodes := []Node{
		{ID: "n0", IP: "10.0.0.1", CPUs: 64, GPUs: 8},
		{ID: "n1", IP: "10.0.0.1", CPUs: 64, GPUs: 4, HeldBy: []string{"t4", "t4", "t4", "t4"}},
		{ID: "n2", IP: "10.0.0.1", CPUs: 64, GPUs: 4, HeldBy: []string{"t4", "t4", "t5", "t5"}},
		{ID: "n3", IP: "10.0.0.1", CPUs: 64, GPUs: 8},
	}
	spec := elasticSpec(t, 2, 2, 64, 0)
	prev, err := Compute(sized(spec, []int{10}), nodes)
	if err != nil {
		t.Fatal(err)
	}
	held := []plan.Note{
		{NodeID: "n1", Component: plan.Eval, Reason: "held by plan t4"},
		{NodeID: "n2", Component: plan.Eval, Reason: "held by plan t4, plan t5"},
	}
	if got := heldNotes(prev.Notes); !slices.Equal(got, held) {
		t.Fatalf("fresh plan's notes %v, want %v", got, held)
	}
	// t5 leaves: n2 is another node now, its note goes with its state.
	t5Left := slices.Clone(nodes)
	t5Left[2].HeldBy = []string{"t4", "t4", "", ""}
	for _, tc := range []struct {
		name  string
		eval  int
		nodes []Node
		want  []plan.Note
	}{
		{"grown", 12, nodes, held},
		{"cut", 8, nodes, held},
		{"cut to the clean node", 6, nodes, held},
		{"grown, n2 changed", 12, t5Left, held[:1]},
		{"cut, n2 changed", 8, t5Left, held[:1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sized(spec, []int{tc.eval})
			var docs [2]*Plan
			for k, readAll := range []bool{false, true} {
				doc, _, err := replanOn(prev, s, &nodeView{base: tc.nodes}, false, readAll, nil)
				if err != nil {
					t.Fatalf("readAll %v: %v", readAll, err)
				}
				if got := countOf(doc, plan.Eval); got != tc.eval {
					t.Fatalf("readAll %v: %d eval, want %d", readAll, got, tc.eval)
				}
				if got := heldNotes(doc.Notes); !slices.Equal(got, tc.want) {
					t.Errorf("readAll %v: held notes %v, want %v", readAll, got, tc.want)
				}
				docs[k] = doc
			}
			if a, b := fmt.Sprint(docs[0].Notes), fmt.Sprint(docs[1].Notes); a != b {
				t.Errorf("notes from the state %s, from the document %s", a, b)
			}
		})
	}
}

// TestElasticShrinkKeepsNotes: PlanAllWith shrinks (or grows) a plan
// whose fresh placement noted the nodes others hold for a plan of
// higher priority, b; the plan cut from every worker (readAll:
// truncated, no state) keeps those notes as the one cut from its state
// (cutFast) does. They were lost where b took 6 GPUs and eval went from
// 10 to 8.
func TestElasticShrinkKeepsNotes(t *testing.T) {
	nodes := []Node{
		{ID: "n0", IP: "10.0.0.1", CPUs: 64, GPUs: 8},
		{ID: "n1", IP: "10.0.0.1", CPUs: 64, GPUs: 4, HeldBy: []string{"t4", "t4", "t4", "t4"}},
		{ID: "n2", IP: "10.0.0.1", CPUs: 64, GPUs: 4, HeldBy: []string{"t4", "t4", "t5", "t5"}},
		{ID: "n3", IP: "10.0.0.1", CPUs: 64, GPUs: 8},
	}
	held := []plan.Note{
		{NodeID: "n1", Component: plan.Eval, Reason: "held by plan t4"},
		{NodeID: "n2", Component: plan.Eval, Reason: "held by plan t4, plan t5"},
	}
	a := Job{Name: "a", Age: 1, Spec: elasticSpec(t, 2, 4, 64, 0)}
	prev, err := Compute(sized(a.Spec, []int{10}), nodes)
	if err != nil {
		t.Fatal(err)
	}
	a.Prev = prev
	for _, tc := range []struct {
		taker, eval int
	}{
		{2, 12}, // grown into what is left
		{4, 10}, // the control: nothing grown or cut, the notes kept as they are
		{6, 8},  // cut
	} {
		t.Run(fmt.Sprintf("b takes %d", tc.taker), func(t *testing.T) {
			jobs := []Job{a, {Name: "b", Age: 2, Spec: trainSpec(t, tc.taker, 10, 0)}}
			var notes [2][]plan.Note
			for k, readAll := range []bool{false, true} {
				o := PlanAllWith(jobs, nodes, ElasticOptions{readAll: readAll})[0]
				if o.Err != nil {
					t.Fatalf("readAll %v: %v", readAll, o.Err)
				}
				if got := countOf(o.Plan, plan.Eval); got != tc.eval {
					t.Fatalf("readAll %v: %d eval, want %d", readAll, got, tc.eval)
				}
				if got := heldNotes(o.Plan.Notes); !slices.Equal(got, held) {
					t.Errorf("readAll %v: held notes %v, want %v", readAll, got, held)
				}
				notes[k] = o.Plan.Notes
			}
			if !slices.Equal(notes[0], notes[1]) {
				t.Errorf("notes from the states %v, from the documents %v", notes[0], notes[1])
			}
		})
	}
}

// heldNotes is the notes of notes that name plans holding the node.
func heldNotes(notes []plan.Note) []plan.Note {
	return slices.DeleteFunc(slices.Clone(notes), func(n plan.Note) bool { return !isHeldNote(n.Reason) })
}

func isHeldNote(reason string) bool {
	return len(reason) > len(ReasonHeldBy) && reason[:len(ReasonHeldBy)] == ReasonHeldBy
}
