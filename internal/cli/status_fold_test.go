package cli

import (
	"strings"
	"testing"
)

// TestStatusFoldsNodes: planner status folds only nodes held alike whose
// ids follow one another in natural order, so a run names exactly the
// nodes it counts.
func TestStatusFoldsNodes(t *testing.T) {
	held := func(ids ...string) []nodeStatus {
		var out []nodeStatus
		for _, id := range ids {
			out = append(out, nodeStatus{NodeID: id, Plans: map[string]int{"default": 8}})
		}
		return out
	}
	cases := []struct {
		name  string
		nodes []nodeStatus
		want  []string
	}{
		{"a node not held breaks the run", held("sim-h100-1", "sim-h100-2", "sim-h100-4"),
			[]string{"sim-h100-1 .. sim-h100-2 (2 nodes)", "sim-h100-4"}},
		{"natural order", held("sim3-gb200-1", "sim3-gb200-10", "sim3-gb200-11", "sim3-gb200-2", "sim3-gb200-3", "sim3-gb200-4", "sim3-gb200-5", "sim3-gb200-6", "sim3-gb200-7", "sim3-gb200-8", "sim3-gb200-9"),
			[]string{"sim3-gb200-1 .. sim3-gb200-11 (11 nodes)"}},
		{"held otherwise", append(held("n1", "n2"), nodeStatus{NodeID: "n3", Plans: map[string]int{"exp": 4}}),
			[]string{"n1 .. n2 (2 nodes)", "n3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &statusReport{Plans: []planStatus{{Name: "default", Valid: true}}, Nodes: c.nodes}
			var b strings.Builder
			r.writePlans(&b)
			_, table, _ := strings.Cut(b.String(), "GPUS HELD BY\n")
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
				got = append(got, strings.TrimSpace(strings.SplitN(line, "  ", 2)[0]))
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("runs %q, want %q\n%s", got, c.want, b.String())
			}
		})
	}
}
