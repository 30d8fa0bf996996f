package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmePreviousExample: the README's `planner plan --previous`
// walkthrough prints what the README shows, line for line (its "..."
// lines aside).
func TestReadmePreviousExample(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const first = "    $ planner plan --inventory examples/cluster-4x8gpu.json --spec examples/disaggregate.yaml --output json > plan.json\n"
	i := strings.Index(string(data), first)
	if i < 0 {
		t.Fatal("README: the --previous walkthrough is gone")
	}
	block := string(data[i:])
	block = block[:strings.Index(block, "\n\n    why\n")+len("\n\n    why\n")]
	rest := string(data[i+len(block):])
	block += rest[:strings.Index(rest, "\n\n")+1]

	dir := t.TempDir()
	planJSON := filepath.Join(dir, "plan.json")
	code, out, errOut := run(t, "plan", "--inventory", "../../examples/cluster-4x8gpu.json", "--spec", "../../examples/disaggregate.yaml", "--output", "json")
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	if err := os.WriteFile(planJSON, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "plan", "--inventory", "../../examples/cluster-4x8gpu-node-02-gone.json", "--spec", "../../examples/disaggregate.yaml", "--previous", planJSON)
	if code != 0 {
		t.Fatalf("plan --previous: exit %d: %s", code, errOut)
	}
	got := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		got[strings.TrimSpace(l)] = true
	}
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "..." || strings.HasPrefix(l, "$ ") {
			continue
		}
		if !got[l] {
			t.Errorf("README shows %q; planner plan --previous prints:\n%s", l, out)
		}
	}
}
