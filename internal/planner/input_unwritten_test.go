package planner

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// cloneNodes is nodes with every slice and map of their own.
func cloneNodes(nodes []Node) []Node {
	out := slices.Clone(nodes)
	for i := range out {
		n := &out[i]
		n.Unhealthy, n.GPUUUIDs, n.Models, n.MemoryBytes = slices.Clone(n.Unhealthy), slices.Clone(n.GPUUUIDs), slices.Clone(n.Models), slices.Clone(n.MemoryBytes)
		n.Labels, n.Peers, n.NUMA, n.HeldBy, n.Drained = maps.Clone(n.Labels), slices.Clone(n.Peers), slices.Clone(n.NUMA), slices.Clone(n.HeldBy), slices.Clone(n.Drained)
	}
	return out
}

// jobsText is what jobs say, specs and previous plans, as JSON: what a
// run must leave as it found it.
func jobsText(t *rapid.T, jobs []Job) string {
	b, err := json.Marshal(jobs)
	if err != nil {
		t.Fatalf("marshal jobs: %v", err)
	}
	return string(b)
}

// TestPlanAllLeavesInput: over random clusters, some GPUs held by plans
// outside the run (HeldBy), unhealthy or drained, and random elastic and
// fixed plans arriving, changing and leaving: PlanAll writes neither the
// caller's nodes nor its jobs (the review of issue 28 found it writing
// other plans' names into a node's HeldBy).
func TestPlanAllLeavesInput(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var nodes []Node
		// 8 to 40 nodes too: a job whose room the others hold on at most
		// an eighth of the cluster reads it as a view over these nodes
		// (remainderView), which a cluster of four never takes.
		for i := range rapid.OneOf(rapid.IntRange(1, 4), rapid.IntRange(8, 40)).Draw(t, "nodes") {
			n := Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{4, 8}).Draw(t, "gpus")}
			for g := range n.GPUs {
				switch rapid.IntRange(0, 7).Draw(t, "gpu") {
				case 0:
					if n.HeldBy == nil {
						n.HeldBy = make([]string, n.GPUs)
					}
					n.HeldBy[g] = "ext"
					n.CPUsHeld++
				case 1:
					n.Unhealthy = append(n.Unhealthy, g)
				case 2:
					n.Drained = append(n.Drained, g)
				}
			}
			nodes = append(nodes, n)
		}
		jobs := map[string]*Job{}
		last := map[string]*Plan{}
		age := uint64(0)
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			name := fmt.Sprintf("j%d", rapid.IntRange(0, 3).Draw(t, "job"))
			if rapid.IntRange(0, 3).Draw(t, "leave") == 0 {
				delete(jobs, name)
				delete(last, name)
			} else {
				if jobs[name] == nil {
					age++
					jobs[name] = &Job{Name: name, Age: age}
				}
				jobs[name].Spec = genElasticSpec(t, name)
			}
			names := slices.Sorted(maps.Keys(jobs))
			in := make([]Job, len(names))
			for i, n := range names {
				in[i] = *jobs[n]
				in[i].Prev = last[n]
			}
			wasNodes, wasJobs := cloneNodes(nodes), jobsText(t, in)
			out := PlanAll(in, nodes)
			if !reflect.DeepEqual(nodes, wasNodes) {
				t.Fatalf("PlanAll wrote its nodes:\n  now %+v\n  was %+v", nodes, wasNodes)
			}
			if now := jobsText(t, in); now != wasJobs {
				t.Fatalf("PlanAll wrote its jobs:\n  now %s\n  was %s", now, wasJobs)
			}
			for i, n := range names {
				last[n] = out[i].Plan
			}
		}
	})
}
