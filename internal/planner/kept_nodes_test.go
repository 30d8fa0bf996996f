package planner

import (
	"encoding/json"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// planText is a plan's document and error as one JSON text.
func planText(t *rapid.T, p *Plan, err error) string {
	b, jerr := json.Marshal(p.Document)
	if jerr != nil {
		t.Fatalf("marshal: %v", jerr)
	}
	if err != nil {
		return string(b) + "\nerror: " + err.Error()
	}
	return string(b)
}

// TestKeptNodesAgree: a fresh run keeps the caller's nodes, in id order,
// as its states' nodes (a copy was 5.6 MB at 20,000 nodes), and plans
// exactly as a run that copies them (nodes out of order): the same
// document, error, and replans after inventory changes, given as new
// slices, the same document, change and error.
func TestKeptNodesAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec := genReplanSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		kept, kerr := Compute(spec, nodes)
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		copied, cerr := Compute(spec, rev)
		if a, b := planText(t, kept, kerr), planText(t, copied, cerr); a != b {
			t.Fatalf("kept nodes:\n%s\ncopied nodes:\n%s", a, b)
		}
		if kept.state == nil {
			return
		}
		if st := kept.state; len(st.nodes) != len(nodes) || &st.nodes[0] != &nodes[0] {
			t.Fatalf("the fresh run copied nodes given in id order")
		}
		if len(nodes) > 1 && copied.state != nil && &copied.state.nodes[0] == &rev[0] {
			t.Fatalf("the fresh run kept nodes given out of order")
		}
		for step := range rapid.IntRange(1, 3).Draw(t, "steps") {
			after, _ := change(t, nodes, step)
			if len(after) == 0 {
				return
			}
			nk, chk, errk := Replan(kept, spec, after)
			nc, chc, errc := Replan(copied, spec, slices.Clone(after))
			if a, b := planText(t, nk, errk), planText(t, nc, errc); a != b {
				t.Fatalf("step %d: from kept nodes:\n%s\nfrom copied nodes:\n%s", step, a, b)
			}
			if a, b := mustJSON(chk), mustJSON(chc); a != b {
				t.Fatalf("step %d: change from kept nodes %s, from copied nodes %s", step, a, b)
			}
			if !nk.Placed() {
				return
			}
			kept, copied, nodes = nk, nc, after
		}
	})
}
