package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// TestPublishFencedByLeadEpoch: the loop publishes only on the lease it
// caught up on. A lease lost and taken again before the loop read the
// events reaches it as one event (taken, the new lease): until the loop
// has caught up on it, the planner does not lead, and a publish (a
// replan timer that fired first) is refused as the lease lost, not
// fenced by the new lease.
func TestPublishFencedByLeadEpoch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := New(Config{NC: h.nc, JS: h.js, NoService: true, Log: zerolog.Nop()})
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	p.fence.elected.Store(true)
	ls := newLeaser(p, zerolog.Nop())
	ls.take(ctx, 0)
	first := <-ls.events
	if first.seq == 0 || first.epoch == 0 {
		t.Fatalf("taking the lease told %+v", first)
	}
	p.led.Store(first.epoch) // the loop caught up on it
	if !p.leads() || !p.Health().Leading {
		t.Fatal("caught up on the lease it holds, the planner does not lead")
	}
	if _, err := p.publishFenced(ctx, bareEvent("default", 1), "d", 0); err != nil {
		t.Fatalf("a publish on the lease led on: %v", err)
	}

	// Lost, then taken again, the loop reading neither yet.
	ls.ask(leaseRequest{epoch: first.epoch, why: "test", release: true})
	ls.requests(ctx)
	if p.leading() != 0 || p.leads() {
		t.Fatal("not stepped down on request")
	}
	ls.take(ctx, 0)
	if p.leading() == 0 {
		t.Fatal("the lease not taken again")
	}
	ev := <-ls.events
	if ev.seq != p.leading() || ev.epoch == first.epoch {
		t.Fatalf("the loop is told %+v, want the new lease at a new epoch (was %+v)", ev, first)
	}
	if p.leads() || p.Health().Leading {
		t.Error("the planner leads on a lease its loop has not caught up on")
	}
	if _, err := p.publishFenced(ctx, bareEvent("default", 2), "d", 0); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("a publish on a lease the loop has not caught up on: %v, want the lease lost", err)
	}

	// A request about the stale lease leaves the new one be; one about
	// the new lease gives it back.
	ls.ask(leaseRequest{epoch: first.epoch, why: "stale", release: true})
	ls.requests(ctx)
	if p.leading() != ev.seq {
		t.Fatalf("a request about the old lease stepped down from the new one")
	}
	ls.ask(leaseRequest{epoch: ev.epoch, why: "give back", release: true})
	ls.requests(ctx)
	if p.leading() != 0 {
		t.Fatal("not stepped down on request")
	}
	if cur, err := p.plans.ReadLease(ctx, bus.LeaseName); err != nil || cur != nil {
		t.Fatalf("the lease after giving it back: %+v, %v", cur, err)
	}
	if lost := <-ls.events; lost.seq != 0 || lost.epoch <= ev.epoch {
		t.Errorf("the loop is told %+v, want the lease lost at a newer epoch", lost)
	}
}

// TestStandDownHoldsInTend: a stand-down's hold makes the leaser look
// again when it ends (tend answers how long), and take nothing before.
func TestStandDownHoldsInTend(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := New(Config{Clock: c, Log: zerolog.Nop()})
	ls := newLeaser(p, zerolog.Nop())
	ls.ask(leaseRequest{why: "test", hold: time.Minute, look: true, next: time.Minute})
	ls.requests(context.Background())
	if got := ls.tend(context.Background()); got != time.Minute {
		t.Errorf("standing down for a minute: next look in %s, want 1m", got)
	}
	c.advance(40 * time.Second)
	if got := ls.tend(context.Background()); got != 20*time.Second {
		t.Errorf("40s later: next look in %s, want 20s", got)
	}
	if p.leading() != 0 {
		t.Error("took a lease while holding off")
	}
}

// TestStepDownClearsLeaderGauge: the leaser stepping down says so in
// the leader gauge at once, not when the loop (maybe stuck) reads the
// event; Health says leading only while the loop leads on the lease
// held.
func TestStepDownClearsLeaderGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := New(Config{Metrics: metrics.NewPlanner(reg), Log: zerolog.Nop()})
	s := p.addState("default")
	s.spec = &planner.Spec{}
	p.publishSnapshot(true)
	ls := newLeaser(p, zerolog.Nop())
	gauge := `poolplanner_plan_leader{plan="default"}`
	p.fence.set(5, 1)
	p.led.Store(1)
	p.leaderGauges()
	if got := scraped(t, reg)[gauge]; got != 1 || !p.Health().Leading {
		t.Fatalf("leading: gauge %v, health leading %v", got, p.Health().Leading)
	}
	ls.stepDown("test")
	if got := scraped(t, reg)[gauge]; got != 0 {
		t.Errorf("stepped down, the loop not told yet: leader gauge %v, want 0", got)
	}
	if p.Health().Leading {
		t.Error("stepped down: health says leading")
	}
	p.fence.set(7, 3) // taken again, the loop not caught up
	if p.Health().Leading {
		t.Error("health says leading on a lease the loop has not caught up on")
	}
}

// TestIdleOnStandby: a standby, which replans nothing, is idle after an
// inventory event: the change it cannot plan on is nothing pending.
func TestIdleOnStandby(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, id := range []string{"n1", "n2", "n3"} {
		h.node(id)
	}
	url := h.nc.ConnectedUrl()
	cfg := Config{Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	a := h.instance(url, cfg)
	h.waitRevision(1)
	b := h.instance(url, cfg)
	if h.waitLeader(5*time.Second, a, b) != a {
		t.Fatal("the first planner does not lead")
	}
	b.following(t, map[string]int{"default": 1})
	h.node("n4")
	natstest.WaitFor(t, 10*time.Second, "the standby seeing n4", func() bool {
		for _, d := range b.p.view().docs {
			if d.NodeID == "n4" {
				return true
			}
		}
		return false
	})
	ictx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.p.Idle(ictx); err != nil {
		t.Fatalf("the standby not idle after an inventory event: %v (health %+v)", err, b.p.Health())
	}
	if got := b.p.Health().Phase; got != "standing by" {
		t.Errorf("phase %q, want standing by", got)
	}
}
