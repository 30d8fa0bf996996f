package planner

import (
	"fmt"
	"testing"
)

// TestPlanAllEmptyHeldBy: a node whose HeldBy is an empty, non-nil list
// (no GPU held: holder reads a short list as none held) must plan as one
// with HeldBy nil. remainderView (share.go) neither copies such a list
// nor can write into it, and indexes it: index out of range.
func TestPlanAllEmptyHeldBy(t *testing.T) {
	spec, _ := ParseSpec([]byte("scheduling: {train: {worker_num: 8, num_cpus: 1, num_gpus: 1}}\n"))
	spec2, _ := ParseSpec([]byte("scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1}}\n"))
	nodes := make([]Node, 2)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("n%d", i), IP: "10.0.0.1", CPUs: 64, GPUs: 8, HeldBy: []string{}}
	}
	for _, o := range PlanAll([]Job{{Name: "a", Spec: spec, Age: 1}, {Name: "b", Spec: spec2, Age: 2}}, nodes) {
		if o.Err != nil {
			t.Errorf("%v", o.Err)
		}
	}
}
