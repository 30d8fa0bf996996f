package service

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// summarySpec fills most of 48 8-GPU nodes, so that a change event
// weighs less than its base and chains of changes form.
const summarySpec = `
scheduling:
  train:  {worker_num: 160, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 8, num_cpus: 1, num_gpus: 2}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 400, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// TestSummaryOfLatest: at every revision of a plan churned (nodes
// leaving and coming back, GPUs failing), the summary a reader gets is
// read from the stored one (of the latest revision, a snapshot, or of
// its chain's base and the change events since), not a rebuild, and
// says what the revision rebuilt whole says; with the summary gone, or
// one of another event, the reader rebuilds and still says the same.
func TestSummaryOfLatest(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := drive(New(Config{NC: h.nc, JS: h.js, Plan: "default", SnapshotEvery: 8, InlineWorkers: -1, Settle: -1, Log: zerolog.Nop()}))
	latest, err := p.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.own().latest = latest
	spec, err := planner.ParseSpec([]byte(summarySpec))
	if err != nil {
		t.Fatal(err)
	}
	p.own().spec, p.own().digest = spec, SpecDigest(spec)
	all := map[string]inventory.NodeInventory{}
	for i := range 48 {
		id := fmt.Sprintf("n%02d", i)
		var doc inventory.NodeInventory
		_ = json.Unmarshal(simDoc(id), &doc)
		all[id] = doc
		_, _ = p.live.put(id, doc)
	}
	cl := wireClient(p)
	check := func(step int, stored bool) string {
		t.Helper()
		whole, err := cl.Plan(ctx, "default", 0)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(plan.SummaryOf(whole.Document, whole.Seq))
		got, err := cl.Summary(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		if got.Whole == stored {
			t.Errorf("step %d (%s): read whole %v, want %v", step, whole.Event.Kind(), got.Whole, !stored)
		}
		if data, _ := json.Marshal(got.Summary); string(data) != string(want) {
			t.Errorf("step %d (%s): summary\n got %s\nwant %s", step, whole.Event.Kind(), data, want)
		}
		if got.Header.Revision != whole.Document.Revision || got.Header.GPUsHeld != whole.Document.GPUsHeld || got.Seq != whole.Seq {
			t.Errorf("step %d: header revision %d gpus %d seq %d, want %d %d %d", step, got.Header.Revision, got.Header.GPUsHeld, got.Seq, whole.Document.Revision, whole.Document.GPUsHeld, whole.Seq)
		}
		return whole.Event.Kind()
	}
	rng := rand.New(rand.NewPCG(3, 30))
	kinds := map[string]int{}
	for step := range 30 {
		if step > 0 {
			id := fmt.Sprintf("n%02d", rng.IntN(48))
			switch doc := all[id]; rng.IntN(3) {
			case 0:
				if !p.live.remove(id) {
					_, _ = p.live.put(id, doc)
				}
			case 1:
				var sick inventory.NodeInventory
				_ = json.Unmarshal(simDoc(id, rng.IntN(8)), &sick)
				_, _ = p.live.put(id, sick)
			case 2:
				_, _ = p.live.put(id, doc)
			}
		}
		if err := p.replan(ctx); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		kinds[check(step, true)]++
	}
	if kinds["change"] == 0 || kinds["snapshot"] == 0 {
		t.Errorf("latest events %v: want changes and snapshots among them", kinds)
	}
	obs, err := h.js.ObjectStore(ctx, client.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	// A summary of another event than the chain's base.
	var other plan.Summary
	other.Name, other.Revision, other.Seq = "default", 1, 1
	data, _ := json.Marshal(other)
	z, _ := wire.Gzip(data)
	if _, err := obs.PutBytes(ctx, wire.SummaryObject("default"), z); err != nil {
		t.Fatal(err)
	}
	check(30, false)
	if err := obs.Delete(ctx, wire.SummaryObject("default")); err != nil && err != jetstream.ErrObjectNotFound {
		t.Fatal(err)
	}
	check(31, false)
}
