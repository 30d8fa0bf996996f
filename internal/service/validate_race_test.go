package service

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// TestValidateSeesWhatLookupSaw: between the stream acking a plan's
// first revision and the loop recording it (published: the marks and
// the kept plan written, then the snapshot), a lookup answers revision
// 1 from the stream; a validation of a new plan asked next must plan
// beside what that revision holds, not beside a plan that holds
// nothing (TestServeAndClients, cli/client_test.go:86, failed so on a
// loaded machine: 'valid' on all four nodes instead of 'available 8').
func TestValidateSeesWhatLookupSaw(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	plans := store.NewPlanStore(h.js)
	if err := plans.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	p := drive(New(Config{NC: h.nc, JS: h.js, Log: zerolog.Nop()}))
	for i := 1; i <= 4; i++ {
		id := fmt.Sprintf("sim-h100-%d", i)
		if _, err := p.live.put(id, inv(id, 8, 224)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) []byte {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	spec, err := planner.ParseSpec(read("../../examples/disaggregate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s := p.addState("default")
	s.spec, s.loaded = spec, true
	p.publishSnapshot(true)

	// Revision 1 as the loop publishes it, the loop not yet past the ack.
	doc, err := planner.Compute(spec, p.view().nodes)
	if err != nil {
		t.Fatal(err)
	}
	doc.Name, doc.Revision = "default", 1
	ev := &plan.Event{Header: doc.Header, Base: 1, Placement: &doc.Placement}
	if _, err := plans.PublishEvent(ctx, ev, "", 0, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Plan(ctx, wire.PlanRequest{Plan: "default"}); err != nil || got.Revision != 1 || planner.HeldGPUs(got) != 24 {
		t.Fatalf("lookup's plan: %v, %+v", err, got)
	}
	reply, err := p.Validate(ctx, read("../../examples/vllm-tp4.yaml"), "")
	if err != nil {
		t.Fatal(err)
	}
	if reply.Valid() || !strings.Contains(reply.Error, "available 8") {
		t.Fatalf("validate vllm-tp4 as a new plan beside default's 24 GPUs: valid %v, error %q", reply.Valid(), reply.Error)
	}
	// The snapshot itself is as the loop published it.
	if p.view().plans["default"].latest != nil {
		t.Error("the validation changed the loop's snapshot")
	}
}
