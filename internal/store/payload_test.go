package store

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

func TestEncodeJSON(t *testing.T) {
	small := &planner.Plan{Document: plan.Document{Header: plan.Header{Name: "p", Revision: 3, Valid: true}}}
	data, h, err := wire.Encode(&small.Document)
	if err != nil || h != nil || !strings.Contains(string(data), `"revision":3`) {
		t.Fatalf("small plan: %s %v %v", data, h, err)
	}
	big := &planner.Plan{Document: plan.Document{Header: plan.Header{Name: "p", Valid: true}}}
	var ws []plan.Worker
	for i := 0; i < 5000; i++ {
		ws = append(ws, plan.Worker{Component: plan.Env, Index: i, Pool: "rollout_pool", NodeID: "node-0001", GPUs: []int{i % 8}, GPUShare: 0.25, CPUs: 1})
	}
	big.Workers = plan.NewWorkers(ws)
	data, h, err = wire.Encode(&big.Document)
	if err != nil || h.Get(wire.EncodingHeader) != wire.EncodingGzip || len(data) > 256<<10 {
		t.Fatalf("big plan: %d bytes, header %v, %v", len(data), h, err)
	}
	var back planner.Plan
	if err := wire.Decode(data, h, &back); err != nil || back.Workers.Len() != 5000 || back.Workers.At(4999).Index != 4999 {
		t.Fatalf("decode: %v (%d workers)", err, back.Workers.Len())
	}
	// A reply that embeds a plan keeps its own fields.
	data, h, _ = wire.Encode(client.ValidateReply{Document: &small.Document, Nodes: 7})
	var vr client.ValidateReply
	if err := wire.Decode(data, h, &vr); err != nil || vr.Nodes != 7 || vr.Revision != 3 {
		t.Fatalf("validate reply: %+v %v", vr, err)
	}
	if err := wire.Decode([]byte("x"), map[string][]string{wire.EncodingHeader: {"br"}}, &vr); err == nil || !strings.Contains(err.Error(), `"br"`) {
		t.Fatalf("unknown encoding: %v", err)
	}
}

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
