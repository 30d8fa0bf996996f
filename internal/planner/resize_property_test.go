package planner

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// genResizeSpec is genReplanSpec with its eval, or its last env entry,
// elastic, and two sizes in its range: the size a plan was made at and
// the size it is asked for next.
func genResizeSpec(t *rapid.T) (spec *Spec, from, to int) {
	spec = genReplanSpec(t)
	sc := &spec.Scheduling
	var g *WorkerGroup
	if len(sc.Env) > 0 && rapid.Bool().Draw(t, "elasticEnv") {
		last := sc.Env[len(sc.Env)-1]
		sc.Env = append(slices.Clip(sc.Env[:len(sc.Env)-1]), last)
		g = &sc.Env[len(sc.Env)-1]
	} else {
		ev := *sc.Eval
		sc.Eval = &ev
		g = sc.Eval
	}
	g.Min = rapid.IntRange(1, 3).Draw(t, "min")
	g.Max = g.Min + rapid.IntRange(0, 8).Draw(t, "room")
	from = rapid.IntRange(g.Min, g.Max).Draw(t, "from")
	to = rapid.IntRange(g.Min, g.Max).Draw(t, "to")
	g.WorkerNum = g.Min
	return spec, from, to
}

// tailLayout reports whether resizing spec's elastic group moves no
// other component's first worker slot: then a run at the new size starts
// from the state of the plan at the old one.
func tailLayout(spec *Spec, from, to int) bool {
	a, b := sized(spec, []int{from}), sized(spec, []int{to})
	env := func(s *Spec) int {
		n := 0
		for _, g := range s.Scheduling.Env {
			n += g.WorkerNum
		}
		return n
	}
	return elasticRefs(spec)[0].c == plan.Env || env(a) == 0 && env(b) == 0
}

// TestResizedAdoptAgrees: a plan made at one elastic size and replanned
// at another, after inventory changes, places exactly what the same
// replan from the plan read back from JSON places (every worker checked
// again, the path that reads no run state); where the resized groups'
// slots come last, the run starts from the plan's state. Cut to a
// smaller size without a replan (truncated), the plan is the one the
// document alone gives.
func TestResizedAdoptAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spec, from, to := genResizeSpec(t)
		nodes := genReplanNodes(t, "n", rapid.IntRange(1, 8).Draw(t, "nodes"))
		prev, err := Compute(sized(spec, []int{from}), nodes)
		if err != nil {
			t.Skip("no fresh plan")
		}
		refs := elasticRefs(spec)
		cut := sized(spec, []int{to})
		if to < from {
			got := truncated(prev, refs, []int{to}, cut, false)
			want := truncated(prev, refs, []int{to}, cut, true)
			if got.state == nil && tailLayout(spec, from, to) {
				t.Fatalf("cut %d -> %d: made without a run's state", from, to)
			}
			// The workers, what they hold and the buffers' map: what a
			// replan reads of a cut plan. (truncated keeps the document's
			// stale export and empty worker counts; the run makes them
			// anew.)
			if !slices.EqualFunc(got.Workers.Slice(), want.Workers.Slice(), SameWorker) || !slices.EqualFunc(scanHeld(got), scanHeld(want), sameIDHold) ||
				!maps.EqualFunc(got.StorageToTrainWorkers, want.StorageToTrainWorkers, slices.Equal) || HeldGPUs(got) != HeldGPUs(want) {
				t.Fatalf("cut %d -> %d differs:\nfrom the state:    %s\nfrom the document: %s", from, to, placementOf(got), placementOf(want))
			}
			if got.state != nil {
				if h := *got.state.held.Load(); !slices.EqualFunc(h, scanHeld(want), sameIDHold) {
					t.Fatalf("cut %d -> %d: patched holding %v, read %v", from, to, h, scanHeld(want))
				}
			}
		}
		after := nodes
		for step := range rapid.IntRange(0, 2).Draw(t, "steps") {
			if next, _ := change(t, after, step); len(next) > 0 {
				after = next
			}
		}
		fast, ch, errFast := Replan(prev, cut, after)
		slow, _, errSlow := Replan(readBack(t, prev), cut, after)
		if (errFast == nil) != (errSlow == nil) {
			t.Fatalf("%d -> %d: from the run's state: %v; from the document: %v", from, to, errFast, errSlow)
		}
		if !SamePlacement(fast, slow) || fast.Moved != slow.Moved {
			t.Fatalf("%d -> %d: placements differ (moved %d, %d):\nfrom the run's state: %s\nfrom the document:    %s", from, to, fast.Moved, slow.Moved, snapshot(fast), snapshot(slow))
		}
		if errFast == nil && !ch.Fresh && tailLayout(spec, from, to) && fast.state.from != prev.state.token {
			t.Fatalf("%d -> %d: the replan read every worker again", from, to)
		}
		if fast.state != nil && fast.state.from == prev.state.token && fast.PlanState() == plan.StateValid {
			// What the allocator keeps of a plan made from another's state:
			// that plan's holding, patched on the nodes the run touched.
			if got, want := patchHeld(fast, heldOf(prev)), scanHeld(fast); !slices.EqualFunc(got, want, sameIDHold) {
				t.Fatalf("%d -> %d: patched holding %v, read %v", from, to, got, want)
			}
		}
	})
}

// TestElasticIncrementalAgrees: over random worlds of elastic and fixed
// plans (plans arriving, changing and leaving, nodes lost and
// returning, growth onto some GPUs only), PlanAllWith, whose trials cut
// and grow plans from their states, gives every plan exactly what it
// gives when every trial reads every worker again (readAll: the search
// as it was before resized runs).
func TestElasticIncrementalAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := &shareWorld{jobs: map[string]*Job{}, last: map[string]*Plan{}}
		for i := range rapid.IntRange(1, 5).Draw(t, "nodes") {
			w.nodes = append(w.nodes, Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{4, 8}).Draw(t, "gpus")})
		}
		var gone []Node
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			switch rapid.IntRange(0, 4).Draw(t, "change") {
			case 0, 1:
				name := fmt.Sprintf("j%d", rapid.IntRange(0, 3).Draw(t, "job"))
				if w.jobs[name] == nil {
					w.age++
					w.jobs[name] = &Job{Name: name, Age: w.age}
				}
				w.jobs[name].Spec = genElasticSpec(t, name)
			case 2:
				if names := slices.Sorted(maps.Keys(w.jobs)); len(names) > 0 {
					name := rapid.SampledFrom(names).Draw(t, "gone")
					delete(w.jobs, name)
					delete(w.last, name)
				}
			case 3:
				if len(w.nodes) > 0 {
					i := rapid.IntRange(0, len(w.nodes)-1).Draw(t, "lost")
					gone = append(gone, w.nodes[i])
					w.nodes = slices.Delete(slices.Clone(w.nodes), i, i+1)
				}
			default:
				if len(gone) > 0 {
					w.nodes = append(slices.Clip(w.nodes), gone[len(gone)-1])
					gone = gone[:len(gone)-1]
				}
			}
			names := slices.Sorted(maps.Keys(w.jobs))
			jobs := make([]Job, len(names))
			for i, n := range names {
				jobs[i] = *w.jobs[n]
				jobs[i].Prev = w.last[n]
			}
			opt := ElasticOptions{}
			if rapid.Bool().Draw(t, "settling") {
				// Growth onto even GPUs only: the service's --grow-after.
				opt.GrowInto = func(_ string, g int) bool { return g%2 == 0 }
			}
			out := PlanAllWith(jobs, w.nodes, opt)
			opt.readAll = true
			want := PlanAllWith(jobs, w.nodes, opt)
			for j := range out {
				if !SamePlacement(out[j].Plan, want[j].Plan) {
					t.Fatalf("%s: from the run's states %s %s %+v\nfrom the documents  %s %s %+v", names[j],
						placementOf(out[j].Plan), stateOf(out[j].Plan), out[j].Plan.Status,
						placementOf(want[j].Plan), stateOf(want[j].Plan), want[j].Plan.Status)
				}
			}
			for i, n := range names {
				w.last[n] = out[i].Plan
			}
		}
	})
}
