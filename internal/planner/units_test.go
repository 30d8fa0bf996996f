package planner

import (
	"fmt"
	"testing"
)

// TestSearchOrders: where the first order falls short, others are tried
// before the spec is declared infeasible, also for a spec without
// constraints that rlightning's order cannot place (its valid plans stay
// rlightning's: the conformance cases); the export of a plan found so
// loads back to the same placement.
func TestSearchOrders(t *testing.T) {
	sick := func(id string) Node {
		n := uniformNodes(1, 8, 64)[0]
		n.ID, n.Unhealthy = id, []int{0}
		return n
	}
	whole := uniformNodes(1, 8, 64)[0]
	whole.ID = "c03"
	cases := []struct {
		name  string
		nodes []Node
		spec  string
	}{
		{name: "rlightning's order takes the only whole node", nodes: []Node{sick("a01"), sick("a02"), whole},
			spec: "scheduling: {train: {worker_num: 14, num_cpus: 1, num_gpus: 1}, eval: {worker_num: 1, num_cpus: 1, num_gpus: 8}}\n"},
		{name: "colocate", nodes: []Node{sick("a01"), sick("a02"), whole},
			spec: "scheduling: {train: {worker_num: 14, num_cpus: 1, num_gpus: 1}, eval: {worker_num: 14, num_cpus: 1, num_gpus: 1}, env: [{worker_num: 1, num_cpus: 1, num_gpus: 8}]}\nplacement: {strategy: colocate}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := mustSpec(t, c.spec)
			e := newEngine(spec, Options{})
			if err := e.run(c.nodes); err == nil {
				t.Fatal("rlightning's order places it: the case proves nothing")
			}
			p, err := Compute(spec, c.nodes)
			if err != nil {
				t.Fatalf("no plan: %v", err)
			}
			for _, e := range checkPlan(spec, c.nodes, p) {
				t.Error(e)
			}
			exportLoadsBack(t, spec, c.nodes, p)
		})
	}
}

func TestAttempts(t *testing.T) {
	cases := []struct{ units, nodes, want int }{
		{2, 10, 4},  // two orders, each in rank order and best fit
		{3, 10, 12}, // 3! orders
		{5, 10, maxAttempts},
		{5, 20000, 6},   // the cluster's size bounds the search
		{3, 1 << 20, 3}, // never fewer than three runs
	}
	for _, c := range cases {
		if got := attempts(c.units, c.nodes); got != c.want {
			t.Errorf("attempts(%d units, %d nodes) = %d, want %d", c.units, c.nodes, got, c.want)
		}
	}
}

func TestPromote(t *testing.T) {
	if got := fmt.Sprint(promote([]int{2, 0, 1, 3}, 1)); got != "[1 2 0 3]" {
		t.Errorf("promote = %s", got)
	}
	if got := fmt.Sprint(promote([]int{2, 0}, -1)); got != "[2 0]" {
		t.Errorf("promote none = %s", got)
	}
}
