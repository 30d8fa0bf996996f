package planner

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestHeldCacheUnderValidations: the loop's replans interleaved with
// what validations run on the very same Prev plans (PlanAll with one
// job's spec replaced, PlanAll with a new job added, PlanBeside, Replan
// of a Prev on another spec), the loop keeping its Prev when a replan
// makes the same placement (the service publishes no revision then),
// nodes joining, leaving, turning unhealthy, reordered: every plan's
// holding (holdingOf with its kept cache, and the cache itself) is what
// a fresh scan of its workers and pools says.
func TestHeldCacheUnderValidations(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 10).Draw(t, "nodes")
		var nodes []Node
		next := 0
		newNode := func() Node {
			g := rapid.SampledFrom([]int{2, 4, 8, 8}).Draw(t, "gpus")
			nd := Node{ID: fmt.Sprintf("n%02d", next), IP: "10.0.0.1", CPUs: float64(rapid.SampledFrom([]int{8, 32, 64}).Draw(t, "cpus")), GPUs: g}
			next++
			return nd
		}
		for range n {
			nodes = append(nodes, newNode())
		}
		spec := func(name string) *Spec {
			switch rapid.IntRange(0, 2).Draw(t, name+"Kind") {
			case 0:
				return genShareSpec(t, name)
			case 1:
				return genElasticSpec(t, name)
			}
			return churnSpec(t, name)
		}
		var jobs []Job
		for j := range rapid.IntRange(1, 3).Draw(t, "plans") {
			jobs = append(jobs, Job{Name: fmt.Sprintf("p%d", j), Age: uint64(j), Spec: spec(fmt.Sprintf("p%d", j))})
		}
		var seen []*Plan // every plan made, checked again at each step
		check := func(step int, what string, ps ...*Plan) {
			seen = append(seen, ps...)
			for _, p := range seen {
				if p == nil || !p.Placed() {
					continue
				}
				want := scanHeld(p)
				if p.state != nil {
					if kept := p.state.held.Load(); kept != nil && !slices.EqualFunc(*kept, want, sameIDHold) {
						t.Fatalf("step %d (%s): plan %s rev %d: kept holding\n%v\nread afresh\n%v", step, what, p.Name, p.Revision, *kept, want)
					}
				}
				if got, want := newAllocator(jobs, nodes).holdingOf(p), denseRef(nodes, want); !got.equal(want) {
					t.Fatalf("step %d (%s): plan %s: holding\n%v\nwant\n%v", step, what, p.Name, got, want)
				}
				if got, want := HeldGPUs(p), scannedGPUs(p); got != want {
					t.Fatalf("step %d (%s): HeldGPUs %d, counted %d", step, what, got, want)
				}
			}
			if len(seen) > 64 {
				seen = seen[len(seen)-64:]
			}
		}
		outs := func(os []Outcome) []*Plan {
			var ps []*Plan
			for _, o := range os {
				ps = append(ps, o.Plan)
			}
			return ps
		}
		rev := 0
		for step := range rapid.IntRange(1, 12).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 8).Draw(t, "op"); op {
			case 0, 1: // the loop
				out := PlanAllWith(jobs, nodes, ElasticOptions{})
				rev++
				for j, o := range out {
					if p := jobs[j].Prev; p != nil && SamePlacement(p, o.Plan) && rapid.Bool().Draw(t, "keepPrev") {
						continue // no revision: the loop keeps its latest
					}
					o.Plan.Name, o.Plan.Revision = jobs[j].Name, rev
					jobs[j].Prev = o.Plan
				}
				check(step, "loop", outs(out)...)
			case 2: // validate --plan NAME: replanAs
				j := rapid.IntRange(0, len(jobs)-1).Draw(t, "as")
				vj := slices.Clone(jobs)
				vj[j].Spec = spec("as")
				check(step, "validate as", outs(PlanAllWith(vj, nodes, ElasticOptions{}))...)
			case 3: // validate a new plan: replanAs, then PlanBeside
				s := spec("new")
				vj := append(slices.Clone(jobs), Job{Name: "(new plan)", Spec: s, Age: 99})
				ps := outs(PlanAllWith(vj, nodes, ElasticOptions{}))
				doc, _ := PlanBeside(s, nodes, jobs)
				check(step, "validate new", append(ps, doc)...)
			case 4: // Replan of a Prev on another spec (or its own)
				j := rapid.IntRange(0, len(jobs)-1).Draw(t, "replan")
				s := jobs[j].Spec
				if rapid.Bool().Draw(t, "otherSpec") {
					s = spec("replan")
				}
				doc, _, _ := Replan(jobs[j].Prev, s, nodes)
				check(step, "replan", doc)
			case 5: // a node leaves
				if len(nodes) > 1 {
					i := rapid.IntRange(0, len(nodes)-1).Draw(t, "leaves")
					nodes = slices.Delete(slices.Clone(nodes), i, i+1)
				}
			case 6: // a node joins
				nodes = append(slices.Clone(nodes), newNode())
			case 7: // a GPU turns unhealthy
				i := rapid.IntRange(0, len(nodes)-1).Draw(t, "sick")
				nodes = slices.Clone(nodes)
				nodes[i].Unhealthy = append(slices.Clone(nodes[i].Unhealthy), rapid.IntRange(0, nodes[i].GPUs-1).Draw(t, "gpu"))
			default: // out of id order, or a spec changes
				if rapid.Bool().Draw(t, "shuffle") {
					i := rapid.IntRange(0, len(nodes)-1).Draw(t, "swap")
					nodes = slices.Clone(nodes)
					nodes[0], nodes[i] = nodes[i], nodes[0]
				} else {
					j := rapid.IntRange(0, len(jobs)-1).Draw(t, "respec")
					jobs[j].Spec = spec("respec")
				}
			}
		}
	})
}
