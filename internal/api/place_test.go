package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

func TestPlacedWorkerJSON(t *testing.T) {
	pw := Place("p\"1", 4, plan.Worker{Component: plan.Eval, Index: 2, Pool: "rollout_pool",
		NodeID: "n1", IP: "10.0.0.1", GPUs: []int{0, 1}, GPUUUIDs: []string{"GPU-a", "GPU-b"}, GPUShare: 1, CPUs: 2.5})
	fast := pw.AppendJSON(nil)
	slow, _ := json.Marshal(pw)
	var a, b any
	if err := json.Unmarshal(fast, &a); err != nil {
		t.Fatalf("%s: %v", fast, err)
	}
	_ = json.Unmarshal(slow, &b)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("fast %s\nslow %s", fast, slow)
	}
	if pw.CUDAVisibleDevices != "GPU-a,GPU-b" {
		t.Errorf("CUDA_VISIBLE_DEVICES %q", pw.CUDAVisibleDevices)
	}
}
