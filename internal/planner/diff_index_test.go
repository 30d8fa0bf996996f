package planner

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// oldIndexNodes is the node index as it was before it held positions:
// every worker copied into its node's change.
func oldIndexNodes(p *Plan) map[string]*plan.NodeChange {
	x := map[string]*plan.NodeChange{}
	if p == nil {
		return x
	}
	node := func(id string) *plan.NodeChange {
		n := x[id]
		if n == nil {
			n = &plan.NodeChange{NodeID: id}
			x[id] = n
		}
		return n
	}
	for _, w := range p.Workers.All() {
		n := node(w.NodeID)
		n.Workers = append(n.Workers, *w)
	}
	for _, pl := range p.Pools {
		for _, pn := range pl.Nodes.All() {
			n := node(pn.NodeID)
			if n.Pools == nil {
				n.Pools = map[string]plan.PoolNode{}
			}
			n.Pools[pl.Name] = *pn
		}
	}
	for _, note := range p.Notes {
		n := node(note.NodeID)
		n.Notes = append(n.Notes, note)
	}
	return x
}

func oldSameNode(a, b *plan.NodeChange) bool {
	if a == nil || b == nil {
		return a == b
	}
	if !slices.EqualFunc(a.Workers, b.Workers, SameWorker) || !slices.Equal(a.Notes, b.Notes) || len(a.Pools) != len(b.Pools) {
		return false
	}
	for name, pa := range a.Pools {
		if pb, ok := b.Pools[name]; !ok || !samePoolNode(pa, pb) {
			return false
		}
	}
	return true
}

func oldChangedNodes(prev, next *Plan) []string {
	was, now := oldIndexNodes(prev), oldIndexNodes(next)
	var ids []string
	for id, n := range now {
		if !oldSameNode(was[id], n) {
			ids = append(ids, id)
		}
	}
	for id := range was {
		if now[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// drawReadBack draws a plan as one read back from JSON (no run state): a few
// nodes' workers, pool entries and notes.
func drawReadBack(t *rapid.T, label string) *Plan {
	node := rapid.SampledFrom([]string{"a", "b", "c", "d"})
	var ws []plan.Worker
	for i := range rapid.IntRange(0, 12).Draw(t, label+" workers") {
		ws = append(ws, plan.Worker{Component: plan.Env, Index: i, Pool: "p", NodeID: node.Draw(t, label+" node"),
			GPUs: []int{rapid.IntRange(0, 1).Draw(t, label+" gpu")}, GPUShare: 0.25, CPUs: 1})
	}
	var pns []plan.PoolNode
	for _, id := range rapid.SliceOfDistinct(node, func(s string) string { return s }).Draw(t, label+" pool nodes") {
		pns = append(pns, plan.PoolNode{NodeID: id, TotalGPUs: rapid.IntRange(1, 2).Draw(t, label+" total")})
	}
	var notes []plan.Note
	for range rapid.IntRange(0, 2).Draw(t, label+" notes") {
		notes = append(notes, plan.Note{NodeID: node.Draw(t, label+" note node"), Component: plan.Env, Reason: "full"})
	}
	return &Plan{Document: plan.Document{Placement: plan.Placement{Workers: plan.NewWorkers(ws), Pools: []plan.Pool{{Name: "p", Nodes: plan.NewPoolNodes(pns)}}, Notes: notes}}}
}

// TestNodeIndexOfPositionsIsOfCopies: the node index that holds workers'
// positions says what the one of copies said: the same changed nodes
// between two plans read back, the same content for each node, and
// NodeIndex the same workers for each node.
func TestNodeIndexOfPositionsIsOfCopies(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prev, next := drawReadBack(t, "prev"), drawReadBack(t, "next")
		if rapid.IntRange(0, 5).Draw(t, "prev nil") == 0 {
			prev = nil
		}
		ids, now := changedNodes(prev, next)
		if want := oldChangedNodes(prev, next); fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Fatalf("changed %v, the copies' %v", ids, want)
		}
		old := oldIndexNodes(next)
		on := next.NodeIndex()
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			want := plan.NodeChange{NodeID: id}
			if n := old[id]; n != nil {
				want = *n
			}
			if got := now.content(id); !reflect.DeepEqual(got, want) {
				t.Fatalf("node %s: %+v, the copies' %+v", id, got, want)
			}
			if got := on(id); !reflect.DeepEqual(got, want.Workers) {
				t.Fatalf("NodeIndex of %s: %+v, the copies' %+v", id, got, want.Workers)
			}
		}
	})
}
