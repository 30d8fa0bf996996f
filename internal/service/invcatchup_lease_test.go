package service

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// TestFirstPlanWaitAfterLeaseLost (review rev9): a lease lost as the
// leaser tells it (leaseEvent seq 0), as one given up (unlead), drops
// the first-revision wait's state, so that a plan still due when the
// planner leads again waits afresh for the watch, not planned at once on
// what it delivered. The leaser's path failed before leaseChanged reset
// it.
func TestFirstPlanWaitAfterLeaseLost(t *testing.T) {
	t.Run("leaser event", func(t *testing.T) { firstPlanWaitAfter(t, false) })
	t.Run("unlead (control)", func(t *testing.T) { firstPlanWaitAfter(t, true) })
}

func firstPlanWaitAfter(t *testing.T, unleadPath bool) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.cluster(2, nil)
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{NC: h.nc, JS: h.js, Clock: c, NoService: true, Log: zerolog.Nop()}))
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	spec, err := planner.ParseSpec([]byte(elasticSpecA))
	if err != nil {
		t.Fatal(err)
	}
	p.addState("a").spec = spec
	l, err := p.newLoop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	l.ride.seen = 0 // the watch delivered nothing yet
	if w := l.inventoryBehind(ctx); w <= 0 {
		t.Fatalf("first wait: %v, want > 0 (bucket holds nodes, watch delivered none)", w)
	}
	if unleadPath {
		l.unlead(leaseRequest{why: "test"})
	} else {
		l.leaseChanged(ctx, leaseEvent{seq: 0}) // the lease lost, as the leaser tells it
	}
	c.now = c.now.Add(10 * time.Second) // leads again later; plan a still due, watch still behind
	if w := l.inventoryBehind(ctx); w <= 0 {
		t.Errorf("after the lease was lost and taken again: wait %v, want a fresh wait (> 0); invCatch %+v", w, l.invCatch)
	}
}
