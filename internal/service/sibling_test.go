package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

func bareEvent(name string, rev int) *plan.Event {
	ev := &plan.Event{Base: rev, Placement: &plan.Placement{ResourcePool: []plan.PoolExport{}, Pools: []plan.Pool{}, StorageToTrainWorkers: map[string][]int{}}}
	ev.Name, ev.Revision = name, rev
	return ev
}

// TestSiblingPublishFenced: after the lead stood down (lease 0, its loop
// running), no plan's publish goes out, its own or another's.
func TestSiblingPublishFenced(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := New(Config{NC: h.nc, JS: h.js, NoService: true, Log: zerolog.Nop()})
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	p.fence.elected.Store(true) // its loop runs; leaseSeq 0: stood down
	if _, err := p.publishFenced(ctx, bareEvent("default", 1), store.Digests{Spec: "d"}, 0); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("the lead's publish after standing down: %v", err)
	}
	if seq, err := p.publishFenced(ctx, bareEvent("other", 1), store.Digests{Spec: "d"}, 0); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("another plan's publish after the lead stood down: seq %d, %v", seq, err)
	}
}

// TestSiblingPublishWaitsForRenewal: another plan's publish takes the
// lead's pubMu, so a renewal (which holds it) cannot change the lease
// between the publish reading it and the stream checking it.
func TestSiblingPublishWaitsForRenewal(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := New(Config{NC: h.nc, JS: h.js, NoService: true, Log: zerolog.Nop()})
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	p.fence.mu.Lock() // as lease.write does during a renewal
	var wg sync.WaitGroup
	wg.Add(1)
	done := make(chan struct{})
	go func() {
		defer wg.Done()
		_, _ = p.publishFenced(ctx, bareEvent("other", 1), store.Digests{Spec: "d"}, 0)
		close(done)
	}()
	select {
	case <-done:
		t.Errorf("sibling publish ran while the lead's pubMu (renewal) was held")
	case <-time.After(time.Second):
	}
	p.fence.mu.Unlock()
	wg.Wait()
}

// TestSpeclessPlanHolds: a plan whose stored spec does not parse (nor
// any before it the history keeps) keeps its last valid revision, and
// no other plan is given its GPUs. (Bad puts push the good one out of
// the history: a purge would be a removal, released as such.)
func TestSpeclessPlanHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"x": shareSpec(8, 0)})
	stop := h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	x := h.waitFor("x", "valid", func(p *planner.Plan) bool { return p.Valid() })
	stop()
	kv, err := specs.(*store.SpecStore).KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < bus.SpecHistory; i++ {
		if _, err := kv.Put(ctx, "x", []byte(fmt.Sprintf("scheduling: [not, a, mapping, %d]", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := specs.Put(ctx, "y", []byte(shareSpec(16, 0))); err != nil {
		t.Fatal(err)
	}
	stop = h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	y := h.waitFor("y", "any", func(p *planner.Plan) bool { return true })
	h.waitPublished("y", 1) // the replan of y planned x too
	x2 := h.waitFor("x", "any", func(p *planner.Plan) bool { return true })
	if x2.Revision != x.Revision || y.Valid() {
		t.Fatalf("x: revision %d valid %v (was %d); y: valid %v, %d GPUs, %q", x2.Revision, x2.Valid(), x.Revision, y.Valid(), y.GPUsHeld, y.Error)
	}
	h.checkShared(x2, y)
}
