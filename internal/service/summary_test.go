package service

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// TestSummaryOfLatest: after churn (changes and snapshots), the summary a
// reader gets is the stored one, not a rebuild, and says what the latest
// revision rebuilt whole says; with the summary gone, or one of an older
// event, the reader rebuilds and still says the same.
func TestSummaryOfLatest(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := New(Config{NC: h.nc, JS: h.js, Plan: "default", SnapshotEvery: 4, InlineWorkers: -1, Settle: -1, Log: zerolog.Nop()})
	churn(t, p, 12)
	c := p.plans.Client()
	whole, err := c.Plan(ctx, "default", 0)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(plan.SummaryOf(whole.Document, whole.Seq))
	check := func(stored bool) {
		t.Helper()
		got, err := c.Summary(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		if got.Whole == stored {
			t.Errorf("read whole %v, want %v", got.Whole, !stored)
		}
		if data, _ := json.Marshal(got.Summary); string(data) != string(want) {
			t.Errorf("summary\n got %s\nwant %s", data, want)
		}
		if got.Header.Revision != whole.Document.Revision || got.Header.GPUsHeld != whole.Document.GPUsHeld || got.Seq != whole.Seq {
			t.Errorf("header revision %d gpus %d seq %d, want %d %d %d", got.Header.Revision, got.Header.GPUsHeld, got.Seq, whole.Document.Revision, whole.Document.GPUsHeld, whole.Seq)
		}
	}
	check(true)
	obs, err := h.js.ObjectStore(ctx, client.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	stale := plan.SummaryOf(whole.Document, whole.Seq-1)
	stale.Workers++
	data, _ := json.Marshal(stale)
	z, _ := wire.Gzip(data)
	if _, err := obs.PutBytes(ctx, wire.SummaryObject("default"), z); err != nil {
		t.Fatal(err)
	}
	check(false)
	if err := obs.Delete(ctx, wire.SummaryObject("default")); err != nil && err != jetstream.ErrObjectNotFound {
		t.Fatal(err)
	}
	check(false)
}
