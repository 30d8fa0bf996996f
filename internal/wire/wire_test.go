package wire_test

import (
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

func TestEncodeJSON(t *testing.T) {
	small := &plan.Document{Header: plan.Header{Name: "p", Revision: 3, Status: plan.Status{State: plan.StateValid}}}
	data, h, err := wire.Encode(small)
	if err != nil || h != nil || !strings.Contains(string(data), `"revision":3`) {
		t.Fatalf("small plan: %s %v %v", data, h, err)
	}
	big := &plan.Document{Header: plan.Header{Name: "p", Status: plan.Status{State: plan.StateValid}}}
	var ws []plan.Worker
	for i := 0; i < 5000; i++ {
		ws = append(ws, plan.Worker{Component: plan.Env, Index: i, Pool: "rollout_pool", NodeID: "node-0001", GPUs: []int{i % 8}, GPUShare: 0.25, CPUs: 1})
	}
	big.Workers = plan.NewWorkers(ws)
	data, h, err = wire.Encode(big)
	if err != nil || h.Get(wire.EncodingHeader) != wire.EncodingGzip || len(data) > 256<<10 {
		t.Fatalf("big plan: %d bytes, header %v, %v", len(data), h, err)
	}
	var back plan.Document
	if err := wire.Decode(data, h, &back); err != nil || back.Workers.Len() != 5000 || back.Workers.At(4999).Index != 4999 {
		t.Fatalf("decode: %v (%d workers)", err, back.Workers.Len())
	}
	// A reply that embeds a plan keeps its own fields.
	data, h, _ = wire.Encode(client.ValidateReply{Document: small, Nodes: 7})
	var vr client.ValidateReply
	if err := wire.Decode(data, h, &vr); err != nil || vr.Nodes != 7 || vr.Revision != 3 {
		t.Fatalf("validate reply: %+v %v", vr, err)
	}
	if err := wire.Decode([]byte("x"), map[string][]string{wire.EncodingHeader: {"br"}}, &vr); err == nil || !strings.Contains(err.Error(), `"br"`) {
		t.Fatalf("unknown encoding: %v", err)
	}
}
