package service

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// TestFirstRevisionAssignments: a first revision's assignments, read
// from the plan node by node (no change), from its run's state or from
// the document alone, are the ones its change from nothing
// (planner.Diff) gives, node for node and in the same order; and every
// node with workers gets one.
func TestFirstRevisionAssignments(t *testing.T) {
	for _, n := range []int{1, 16, 48} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			spec, err := planner.ParseSpec([]byte(scaleSpec(n)))
			if err != nil {
				t.Fatal(err)
			}
			nodes := make([]planner.Node, n)
			for i := range nodes {
				id := fmt.Sprintf("node-%05d", i)
				var doc inventory.NodeInventory
				if err := json.Unmarshal(simDoc(id), &doc); err != nil {
					t.Fatal(err)
				}
				if nodes[i], err = doc.PlannerNode(); err != nil {
					t.Fatal(err)
				}
			}
			next, err := planner.Compute(spec, nodes)
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			collect := func(p *planner.Plan, change *plan.Change) []client.Assignment {
				var out []client.Assignment
				for a := range changedAssignments(nil, p, change) {
					out = append(out, a)
				}
				return out
			}
			got, want := collect(next, nil), collect(next, planner.Diff(nil, next))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("read node by node: %v\nfrom the change: %v", got, want)
			}
			// A plan read back (no run's state) reads its workers by node
			// from one index.
			back := &planner.Plan{Document: next.Document}
			if got := collect(back, nil); !reflect.DeepEqual(got, want) {
				t.Fatalf("read back: %v\nfrom the change: %v", got, want)
			}
			placed := map[string]bool{}
			for _, w := range next.Workers.All() {
				placed[w.NodeID] = true
			}
			if len(got) != len(placed) || len(got) == 0 {
				t.Fatalf("%d assignments for %d nodes with workers", len(got), len(placed))
			}
		})
	}
}

// batchPlans is a plan store whose assignment publishes it records: each
// call's size, refusing the assignments of the nodes in refuse.
type batchPlans struct {
	planStore
	calls  []int
	refuse map[string]bool
}

func (b *batchPlans) PublishAssignments(_ context.Context, as []client.Assignment, _ bool) (int, error) {
	b.calls = append(b.calls, len(as))
	refused := 0
	for i := range as {
		if b.refuse[as[i].NodeID] {
			as[i].Seq = 0
			refused++
			continue
		}
		as[i].Seq = uint64(1000 + i)
	}
	return refused, nil
}

// TestAssignmentBatches: assignments go out assignBatch at a time, each
// node's sequence is noted, and refusals anywhere among the batches
// call for one reconcile.
func TestAssignmentBatches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		refuse []string
		calls  []int
	}{
		{"none", 0, nil, nil},
		{"one", 1, nil, []int{1}},
		{"a batch", assignBatch, nil, []int{assignBatch}},
		{"past a batch", 2*assignBatch + 7, nil, []int{assignBatch, assignBatch, 7}},
		{"refused in the last", assignBatch + 3, []string{"n1025"}, []int{assignBatch, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &batchPlans{refuse: map[string]bool{}}
			for _, id := range tc.refuse {
				b.refuse[id] = true
			}
			p := &Service{plans: b, pulse: newPulse(time.Now)}
			s := newPlanState("default", zerolog.Nop())
			out := assignmentSender{p: p, s: s}
			for i := range tc.n {
				if err := out.add(context.Background(), client.Assignment{Plan: "default", NodeID: fmt.Sprintf("n%d", i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := out.done(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(b.calls, tc.calls) {
				t.Fatalf("publishes of %v assignments, want %v", b.calls, tc.calls)
			}
			if len(s.assignSeq) != tc.n-len(tc.refuse) {
				t.Errorf("%d sequences noted, want %d", len(s.assignSeq), tc.n-len(tc.refuse))
			}
			if s.reconcile != (len(tc.refuse) > 0) {
				t.Errorf("reconcile %v with %d refused", s.reconcile, len(tc.refuse))
			}
		})
	}
}
