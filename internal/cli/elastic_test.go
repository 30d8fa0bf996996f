package cli

import (
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestPlanElastic: the offline planner grows an elastic group to its
// max within the inventory and says so; a previous plan losing a node
// shrinks it and the dry run says how.
func TestPlanElastic(t *testing.T) {
	for _, tc := range []struct {
		name, inventory, want string
	}{
		{name: "to max within the cluster", inventory: "../../examples/cluster-4x8gpu.json", want: "workers: train 8, buffer 1, eval 24 of 4..32\n"},
		{name: "one node", inventory: "../../examples/cluster-1x8gpu.json", want: "INVALID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, out, _ := run(t, "plan", "--inventory", tc.inventory, "--spec", "../../examples/elastic.yaml")
			if !strings.Contains(out, tc.want) {
				t.Fatalf("want %q in:\n%s", tc.want, out)
			}
		})
	}
	code, js, errOut := run(t, "plan", "--inventory", "../../examples/cluster-4x8gpu.json", "--spec", "../../examples/elastic.yaml", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	prev := writeFile(t, "prev.json", js)
	code, out, errOut := run(t, "plan", "--inventory", "../../examples/cluster-4x8gpu-node-02-gone.json", "--spec", "../../examples/elastic.yaml", "--previous", prev)
	if code != 0 || !strings.Contains(out, "dry run from the previous plan: shrank eval 24 -> 16 to re-place its own workers") || !strings.Contains(out, "eval 16 of 4..32") {
		t.Fatalf("exit %d: %s\n%s", code, out, errOut)
	}
}

// TestStatusElastic: planner status shows each elastic group of a plan
// as "current (min..max)", and the table of fixed plans as before.
func TestStatusElastic(t *testing.T) {
	doc := &plan.Document{}
	doc.Demands = []plan.Demand{{Component: plan.Train, Workers: 8}, {Component: plan.Eval, Workers: 12, Min: 4, Max: 32},
		{Component: plan.Env, Workers: 2}, {Component: plan.Env, Workers: 3, Min: 1, Max: 6}}
	st := plan.Status{State: plan.StateValid}
	for _, tc := range []struct {
		name  string
		plans []planStatus
		want  []string
		not   string
	}{
		{name: "elastic", plans: []planStatus{{Name: "a", Status: &st, Elastic: elasticOf(&doc.Header)}, {Name: "b", Status: &st}},
			want: []string{"ELASTIC", "eval 12 (4..32), env[1] 3 (1..6)", "\nb "}},
		{name: "fixed only", plans: []planStatus{{Name: "b", Status: &st}}, want: []string{"PLAN  PRIORITY  REVISION  GPUS  WORKERS  STATE\n"}, not: "ELASTIC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &statusReport{Plans: tc.plans}
			var b strings.Builder
			r.writePlans(&b)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("want %q in:\n%s", w, b.String())
				}
			}
			if tc.not != "" && strings.Contains(b.String(), tc.not) {
				t.Errorf("%q in:\n%s", tc.not, b.String())
			}
		})
	}
}
