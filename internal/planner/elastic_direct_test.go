package planner

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// sameOutcomes fails t where got and want differ in a plan's placement,
// status or error.
func sameOutcomes(t interface{ Fatalf(string, ...any) }, names []string, got, want []Outcome) {
	for j := range got {
		g, w := got[j].Plan, want[j].Plan
		if !SamePlacement(g, w) || !reflect.DeepEqual(g.Status, w.Status) || g.Error != w.Error || (got[j].Err == nil) != (want[j].Err == nil) {
			t.Fatalf("%s: direct %s %+v %q\nsearch %s %+v %q", names[j], placementOf(g), g.Status, g.Error, placementOf(w), w.Status, w.Error)
		}
	}
}

// TestElasticDirect: a plan that holds nothing yet, on a cluster an
// elastic plan fills, is given room by arithmetic alone (direct: the
// surplus to give up counted in GPUs) where every unit frees whole GPUs
// and every other plan holds its placement for its spec; the outcome is
// the search's.
func TestElasticDirect(t *testing.T) {
	nodes := shareNodes(4)
	grown := func(t *testing.T) Job {
		a := Job{Name: "a", Spec: elasticSpec(t, 8, 4, 32, 0), Age: 1}
		a.Prev = planAll(t, []Job{a}, nodes)["a"].Plan
		if countOf(a.Prev, "eval") != 24 {
			t.Fatalf("a grew to %d eval, want 24", countOf(a.Prev, "eval"))
		}
		return a
	}
	for _, tc := range []struct {
		name string
		b    func(t *testing.T) *Spec
		k    int // units direct gives up; 0: direct does not apply
		eval int // a's eval after
	}{
		{"higher priority", func(t *testing.T) *Spec { return trainSpec(t, 12, 10, 0) }, 12, 12},
		{"lower priority", func(t *testing.T) *Spec { return trainSpec(t, 3, 0, 0) }, 3, 21},
		{"more than the surplus", func(t *testing.T) *Spec { return trainSpec(t, 21, 10, 0) }, 0, 0}, // a preempted whole
		{"taker over its quota", func(t *testing.T) *Spec { return trainSpec(t, 12, 10, 8) }, 0, 24},
		{"fractional taker", func(t *testing.T) *Spec {
			return specT(t, "priority: 10\nscheduling:\n  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: 3, num_cpus: 1, num_gpus: 0.5}\n")
		}, 4, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := grown(t)
			b := Job{Name: "b", Spec: tc.b(t), Age: 2}
			jobs := []Job{a, b}
			el := &elastic{jobs: jobs, nodes: nodes, refs: [][]elasticRef{elasticRefs(a.Spec), nil}}
			el.start = [][]int{startCounts(&jobs[0], el.refs[0]), nil}
			k, _, ok := el.direct(el.start)
			if ok != (tc.k > 0) || ok && k != tc.k {
				t.Fatalf("direct: %d %v, want %d", k, ok, tc.k)
			}
			got := PlanAllWith(jobs, nodes, ElasticOptions{})
			want := PlanAllWith(jobs, nodes, ElasticOptions{searchOnly: true})
			sameOutcomes(t, []string{"a", "b"}, got, want)
			if n := countOf(got[0].Plan, "eval"); n != tc.eval || got[1].Plan.Valid() != (tc.eval != 24) {
				t.Fatalf("a's eval %d, want %d; b valid %v: %v", n, tc.eval, got[1].Plan.Valid(), got[1].Err)
			}
		})
	}
}

// TestElasticDirectAgrees: over random clusters and random plans
// arriving, changing and leaving and nodes leaving and returning, every
// run plans as the search of trials alone would.
func TestElasticDirectAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var nodes, gone []Node
		for i := range rapid.IntRange(1, 5).Draw(t, "nodes") {
			nodes = append(nodes, Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{4, 8}).Draw(t, "gpus")})
		}
		specs, last, age := map[string]*Job{}, map[string]*Plan{}, uint64(0)
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			switch rapid.IntRange(0, 4).Draw(t, "change") {
			case 0, 1:
				name := fmt.Sprintf("j%d", rapid.IntRange(0, 3).Draw(t, "job"))
				if specs[name] == nil {
					age++
					specs[name] = &Job{Name: name, Age: age}
				}
				specs[name].Spec = genElasticSpec(t, name)
			case 2:
				if names := slices.Sorted(maps.Keys(specs)); len(names) > 0 {
					name := rapid.SampledFrom(names).Draw(t, "gone")
					delete(specs, name)
					delete(last, name)
				}
			case 3:
				if len(nodes) > 0 {
					i := rapid.IntRange(0, len(nodes)-1).Draw(t, "lost")
					gone = append(gone, nodes[i])
					nodes = slices.Delete(slices.Clone(nodes), i, i+1)
				}
			default:
				if len(gone) > 0 {
					nodes = append(slices.Clip(nodes), gone[len(gone)-1])
					gone = gone[:len(gone)-1]
				}
			}
			names := slices.Sorted(maps.Keys(specs))
			jobs := make([]Job, len(names))
			for i, n := range names {
				jobs[i] = *specs[n]
				jobs[i].Prev = last[n]
			}
			out := PlanAllWith(jobs, nodes, ElasticOptions{})
			sameOutcomes(t, names, out, PlanAllWith(jobs, nodes, ElasticOptions{searchOnly: true}))
			for i, n := range names {
				last[n] = out[i].Plan
			}
		}
	})
}
