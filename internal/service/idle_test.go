package service

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// TestIdleAfterFirstPlan: once the first plan is out, the loop says it
// leads and, with nothing pending, that it is idle; a node that holds
// workers leaving makes a revision, after which it is idle again with
// no other.
func TestIdleAfterFirstPlan(t *testing.T) {
	h := newMemHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, id := range []string{"n1", "n2", "n3"} {
		h.node(id)
	}
	p := New(Config{NC: h.nc, JS: h.js, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, NoService: true, Log: zerolog.Nop()})
	h.mem.onMem(p)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	first := h.waitRevision(1)
	if st := first.Status; st.State != plan.StateValid || st.Fresh != plan.FreshFirst {
		t.Errorf("revision 1's status %+v, want valid, fresh first", st)
	}
	ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
	defer icancel()
	if err := p.Idle(ictx); err != nil {
		t.Fatalf("not idle after the first plan: %v (health %+v)", err, p.Health())
	}
	if got := p.Health().Phase; got != "leading" {
		t.Errorf("phase %q, want leading", got)
	}
	h.kill(first.Workers.At(0).NodeID)
	h.waitRevision(2)
	if err := p.Idle(ictx); err != nil {
		t.Fatalf("not idle after revision 2: %v", err)
	}
	if got := h.history(); len(got) != 2 {
		t.Errorf("revisions %v, want [1 2]", revisions(got))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// fakeClock is a Clock whose time moves only when told (advance): its
// timers fire then.
type fakeClock struct {
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	clock *fakeClock
	c     chan time.Time
	at    time.Time
	live  bool
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: c, c: make(chan time.Time, 1), at: c.now.Add(d), live: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop() bool {
	was := t.live
	t.live = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	was := t.live
	t.at, t.live = t.clock.now.Add(d), true
	return was
}

// advance moves the clock by d, firing the timers due.
func (c *fakeClock) advance(d time.Duration) {
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if t.live && !t.at.After(c.now) {
			t.live = false
			t.c <- c.now
		}
	}
}

// TestSettleByClock: a plan found at start waits for its nodes by the
// service's clock: settle time left runs out as the clock moves, not
// as the wall clock does.
func TestSettleByClock(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{Clock: c, Settle: time.Minute, Log: zerolog.Nop()}))
	s := p.addState("default")
	s.inherited = planOn("n1")
	started := c.Now()
	for _, step := range []struct {
		after time.Duration
		want  time.Duration
	}{{0, time.Minute}, {40 * time.Second, 20 * time.Second}, {20 * time.Second, 0}} {
		c.advance(step.after)
		if got := s.settling(p.cfg.Settle - p.since(started)); got != step.want {
			t.Errorf("after %s more: settling %s, want %s", step.after, got, step.want)
		}
	}
	c.now = started
	s.reported["n1"] = true
	if got := s.settling(p.cfg.Settle - p.since(started)); got != 0 {
		t.Errorf("with its node reported: settling %s, want 0", got)
	}
}

// planOn is a plan whose one pool has the nodes ids.
func planOn(ids ...string) *planner.Plan {
	var nodes []plan.PoolNode
	for _, id := range ids {
		nodes = append(nodes, plan.PoolNode{NodeID: id})
	}
	pl := plan.Pool{Name: "p", Nodes: plan.NewPoolNodes(nodes)}
	doc := &planner.Plan{}
	doc.Pools = []plan.Pool{pl}
	return doc
}

// TestIdleOnStandby: a standby, which replans nothing, is idle after an
// inventory event: the change it cannot plan on is nothing pending.
func TestIdleOnStandby(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	for _, id := range []string{"n1", "n2", "n3"} {
		h.node(id)
	}
	url := h.url()
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
