package cli

import (
	"strings"
	"testing"
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
