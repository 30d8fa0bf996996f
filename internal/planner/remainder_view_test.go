package planner

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// TestRemainderViewsAgree: a run on a remainder's marks, or on its
// sparse copies, plans exactly as a run on every node copied with the
// holds written in (the remainder as a slice): afresh, then replanned
// from each of those plans on a remainder whose holds changed, and once
// more on the first remainder, the same document, change and error.
// Some nodes are held by a plan outside the run too (the caller's
// HeldBy), which a remainder's holds are written over.
func TestRemainderViewsAgree(t *testing.T) {
	kinds := []viewKind{viewCopy, viewMarks, viewSparse}
	rapid.Check(t, func(t *rapid.T) {
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		for i := range nodes {
			n := &nodes[i]
			if n.GPUs == 0 || rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("outside%d", i)) > 0 {
				continue
			}
			n.HeldBy = make([]string, n.GPUs)
			n.HeldBy[rapid.IntRange(0, n.GPUs-1).Draw(t, fmt.Sprintf("outside%d.gpu", i))] = "outside"
			n.CPUsHeld = float64(rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("outside%d.cpus", i)))
		}
		others := []Job{{Name: "x", Spec: genReplanSpec(t), Age: 1}, {Name: "y", Spec: genReplanSpec(t), Age: 2}}
		a := newAllocator(nil, nodes)
		var first, second []blocker
		for k, o := range PlanAll(others, nodes) {
			if o.Plan.Placed() {
				b := blocker{others[k].Name, a.holdingOf(o.Plan)}
				first = append(first, b)
				if k == 0 {
					second = append(second, b)
				}
			}
		}
		// The second remainder: y gone, x's holds only, and the GPUs of
		// one more node held by a plan z.
		if len(nodes) > 0 {
			at := int32(rapid.IntRange(0, len(nodes)-1).Draw(t, "z.node"))
			h := newHold(at, nil, 1)
			for g := range nodes[at].GPUs {
				h.gpus = append(h.gpus, g)
			}
			second = append(second, blocker{"z", holding{h}})
		}
		spec := genReplanSpec(t)
		next := spec
		if rapid.Bool().Draw(t, "respec") {
			next = genReplanSpec(t)
		}
		keep := rapid.Bool().Draw(t, "keep")
		text := func(p *Plan, ch *Change, err error) string {
			s := planText(t, p, err)
			if p != nil {
				s += fmt.Sprintf("\nmoved %d", p.Moved)
			}
			if ch != nil {
				s += fmt.Sprintf("\nchange %+v", *ch)
			}
			return s
		}
		var want []string
		check := func(step string, kind []viewKind, got []string) {
			t.Helper()
			if want == nil {
				want = got
				return
			}
			if len(got) != len(want) {
				t.Fatalf("%s on %v: %d plans, want %d:\n%v\nwant\n%v", step, kind, len(got), len(want), got, want)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s on %v: got\n%s\nwant (every node copied)\n%s", step, kind, got[i], want[i])
				}
			}
		}
		for _, k := range kinds {
			v := a.remainderOf(first, nil, k)
			prev, err := computeOn(spec, &v)
			got := []string{text(prev, nil, err)}
			if err == nil || prev.Placed() {
				for _, k2 := range kinds {
					v2 := a.remainderOf(second, nil, k2)
					doc, ch, err := replanOn(prev, next, &v2, keep, false, nil)
					got = append(got, text(doc, ch, err))
					if doc == nil || !doc.Placed() {
						continue
					}
					v3 := a.remainderOf(first, nil, k)
					doc, ch, err = replanOn(doc, next, &v3, keep, false, nil)
					got = append(got, text(doc, ch, err))
				}
			}
			check("afresh, replanned, replanned back", []viewKind{k}, got)
		}
	})
}
