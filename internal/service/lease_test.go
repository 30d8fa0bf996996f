package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// instance is a planner on a connection of its own, so that a test can
// cut it off as a crash would.
type instance struct {
	p      *Service
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	// reg is its metrics, when the test gave it none of its own.
	reg *prometheus.Registry
}

// On a memJS harness (newMemHarness) url is unused: the planner plans on
// h.mem, with no connection to cut (crash is NATS's).
// setup, run after its stores are bound, may wrap them.
func (h *harness) instance(url string, cfg Config, setup ...func(*Service)) *instance {
	h.t.Helper()
	var nc *nats.Conn
	if h.mem == nil {
		var err error
		if nc, err = nats.Connect(url); err != nil {
			h.t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		cfg.NC, cfg.JS = nc, js
	} else {
		cfg.NoService = true // requests are the wire's, tested on NATS
		if cfg.Clock == nil {
			cfg.Clock = h.mem.clock
		}
	}
	cfg.Log = zerolog.Nop()
	var reg *prometheus.Registry
	if cfg.Metrics == nil {
		reg = prometheus.NewRegistry()
		cfg.Metrics = metrics.NewPlanner(reg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{p: New(cfg), nc: nc, cancel: cancel, done: make(chan struct{}), reg: reg}
	if h.mem != nil {
		h.mem.onMem(in.p)
	}
	for _, f := range setup {
		f(in.p)
	}
	go func() {
		defer close(in.done)
		if err := in.p.Run(ctx); err != nil {
			h.t.Errorf("planner: %v", err)
		}
	}()
	h.t.Cleanup(in.stop)
	return in
}

// crash cuts the planner off without a word: no lease given back.
func (in *instance) crash() {
	if in.nc == nil {
		panic("crash cuts a NATS connection: the test needs newHarness")
	}
	in.nc.Close()
	in.stop()
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
	if in.nc != nil {
		in.nc.Close()
	}
}

// following waits until the planner holds the latest revision of each
// plan named in want (a standby follows the leader's).
func (in *instance) following(t *testing.T, want map[string]int) {
	t.Helper()
	natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("a planner following revisions %v", want), func() bool {
		got := map[string]int{}
		for _, p := range in.p.Plans() {
			got[p.Name] = p.Revision
		}
		for name, rev := range want {
			if got[name] != rev {
				return false
			}
		}
		return true
	})
}

// replanned waits until the planner finished a replan of plan (its
// metrics): after it took the lease, one it made on taking it.
func (in *instance) replanned(t *testing.T, plan string) {
	t.Helper()
	in.replannedTimes(t, plan, 1)
}

// replannedTimes waits until the planner finished n replans of plan.
func (in *instance) replannedTimes(t *testing.T, plan string, n int) {
	t.Helper()
	waitScraped(t, in.reg, fmt.Sprintf("%d replans of %s", n, plan), func(m map[string]float64) bool {
		return m[fmt.Sprintf("poolplanner_replan_duration_seconds{plan=%q}", plan)] >= float64(n)
	})
}

// waitLeader waits until one of ins holds the lease, and returns it.
func (h *harness) waitLeader(within time.Duration, ins ...*instance) *instance {
	h.t.Helper()
	plans := h.plans()
	var leader *instance
	natstest.WaitFor(h.t, within, fmt.Sprintf("one of %d planners leading", len(ins)), func() bool {
		l, err := plans.ReadLease(context.Background(), "default")
		if err != nil || l == nil {
			return false
		}
		for _, in := range ins {
			if in.p.plans.Publisher() == l.Holder && in.p.leading() == l.Seq {
				leader = in
			}
		}
		return leader != nil
	})
	return leader
}

// TestFailover: of two planners one leads and publishes; the other
// stands by. When the leader dies, the standby takes the lease within its
// TTL and a poll, publishes nothing while nothing changed, and continues
// the revision sequence when a node dies. A leader that stops cleanly
// hands over at once.
func TestFailover(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 4 {
		h.node(fmt.Sprintf("n%02d", i))
	}
	url := h.url()
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	a := h.instance(url, cfg)
	first := h.waitRevision(1)
	b := h.instance(url, cfg)
	if h.waitLeader(5*time.Second, a, b) != a {
		t.Fatal("the first planner does not lead")
	}
	b.following(t, map[string]int{"default": 1}) // it runs, and reads the lease
	if b.p.leading() != 0 {
		t.Fatal("the standby leads too")
	}

	a.crash()
	crashed := time.Now()
	h.waitLeader(5*time.Second, b)
	t.Logf("standby took over %s after the leader died (lease TTL 1s)", time.Since(crashed).Round(10*time.Millisecond))
	b.replanned(t, "default") // on taking the lease
	if got := h.history(); len(got) != 1 {
		t.Fatalf("taking over published revisions %v with nothing changed", revisions(got))
	}

	h.kill(first.Workers.At(0).NodeID)
	second := h.waitRevision(2)
	if !second.Valid() || second.Reason == "" {
		t.Fatalf("revision 2 after the takeover: valid %v, reason %q", second.Valid(), second.Reason)
	}

	// A clean stop gives the lease back: a new standby leads at its
	// next look, not after the TTL.
	c := h.instance(url, cfg)
	c.following(t, map[string]int{"default": 2})
	b.stop()
	h.waitLeader(2*time.Second, c)
}

// TestPausedLeaderCannotPublish: a leader that was paused past its
// lease's TTL, while another planner took the lease, wakes and tries to
// publish: the stream refuses it (the publish checks the lease), and the
// new leader's revisions continue the sequence.
func TestPausedLeaderCannotPublish(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	take := func(p *loopState) {
		t.Helper()
		l := &bus.Lease{Holder: p.plans.Publisher(), Since: time.Now(), Renewed: time.Now(), TTLSeconds: 1}
		natstest.WaitFor(t, 5*time.Second, "the lease taken", func() bool {
			seq, err := p.plans.WriteLease(ctx, "default", l, 0)
			if err == nil {
				p.fence.seq.Store(seq)
				return true
			}
			if !errors.Is(err, bus.ErrLeaseHeld) {
				t.Fatalf("take the lease: %v", err)
			}
			return false
		})
	}
	a := offline(t, h, 4)
	take(a)
	if err := a.replan(ctx); err != nil {
		t.Fatal(err)
	}
	// a pauses; its lease lapses; b takes it.
	b := offline(t, h, 4)
	take(b)
	sp, err := b.plans.Latest(ctx, "default")
	if err != nil || sp == nil {
		t.Fatalf("latest: %v", err)
	}
	b.own().latest = sp

	// a wakes, sees a node gone, and tries to publish revision 2.
	a.live.remove("n00")
	if err := a.replan(ctx); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("a paused leader published: %v", err)
	}
	if got := h.history(); len(got) != 1 {
		t.Fatalf("revisions %v after the paused leader woke, want [1]", revisions(got))
	}
	b.live.remove("n01")
	if err := b.replan(ctx); err != nil {
		t.Fatal(err)
	}
	got := h.history()
	if len(got) != 2 || got[1].Revision != 2 {
		t.Fatalf("revisions %v, want [1 2]", revisions(got))
	}
	if onNode(got[1], "n01") || !onNode(got[1], "n00") {
		t.Error("revision 2 is not the new leader's plan")
	}
}

func onNode(p *planner.Plan, node string) bool {
	for _, w := range p.Workers.All() {
		if w.NodeID == node {
			return true
		}
	}
	return false
}

// TestDeposedLeaderAssignments: a leader deposed between a revision and
// its assignments cannot overwrite the assignments the new leader wrote
// since; it is refused, and left to reconcile.
func TestDeposedLeaderAssignments(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	a := offline(t, h, 4)
	if err := a.replan(ctx); err != nil {
		t.Fatal(err)
	}
	node := a.own().latest.Plan.Workers.At(0).NodeID
	b := offline(t, h, 4)
	if err := b.reconcileAssignments(ctx, b.own()); err != nil { // what a new leader does first
		t.Fatal(err)
	}
	b.live.remove(node)
	if err := b.replan(ctx); err != nil {
		t.Fatal(err)
	}
	ours, err := b.plans.Assignment(ctx, "default", node)
	if err != nil || len(ours.Workers) != 0 || ours.Revision != 2 {
		t.Fatalf("the new leader's assignment of %s: %+v %v", node, ours, err)
	}
	// a wakes and sends revision 1's workers for the node.
	stale := assignment(a.own().latest.Plan, node, a.own().latest.Plan.NodeIndex()(node))
	stale.Seq = a.own().assignSeq[node]
	if err := a.sendAssignments(ctx, a.own(), []client.Assignment{stale}); err != nil {
		t.Fatal(err)
	}
	got, err := b.plans.Assignment(ctx, "default", node)
	if err != nil || got.Seq != ours.Seq || len(got.Workers) != 0 {
		t.Fatalf("the deposed leader overwrote the assignment: %+v %v", got, err)
	}
	if !a.checkPending() {
		t.Error("the refusal does not call for a reconcile")
	}
}

// TestRenewalsDoNotRefusePublishes: a leader's publishes racing its own
// lease renewals are never refused (a renewal is recorded before any
// publish may read the lease), and once it stood down a planner with its
// loop publishes nothing unfenced.
func TestRenewalsDoNotRefusePublishes(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	p := offline(t, h, 4)
	p.cfg.LeaseTTL = 5 * time.Second
	ls := newLeaser(p.Service, zerolog.Nop())
	ls.take(ctx, 0)
	if p.leading() == 0 {
		t.Fatal("no lease")
	}
	p.fence.elected.Store(true)
	p.led.Store(p.fence.epoch.Load()) // as the loop does, caught up
	stop := make(chan struct{})
	renewed := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				renewed <- n
				return
			default:
				ls.renew(ctx)
				n++
			}
		}
	}()
	var doc inventory.NodeInventory
	_ = json.Unmarshal(simDoc("n03"), &doc)
	for i := range 30 {
		if i%2 == 0 {
			p.live.remove("n03")
		} else {
			_, _ = p.live.put("n03", doc)
		}
		if err := p.replan(ctx); err != nil {
			close(stop)
			t.Fatalf("publish %d refused while leading: %v", i, err)
		}
	}
	close(stop)
	if n := <-renewed; n < 10 {
		t.Logf("only %d renewals raced the publishes", n)
	}
	ls.stepDown("test")
	p.live.remove(p.own().latest.Plan.Workers.At(0).NodeID)
	if err := p.replan(ctx); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("a planner that stood down published: %v", err)
	}
}

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
	if _, err := p.publishFenced(ctx, bareEvent("default", 1), store.Digests{Spec: "d"}, 0); err != nil {
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
	if _, err := p.publishFenced(ctx, bareEvent("default", 2), store.Digests{Spec: "d"}, 0); !errors.Is(err, bus.ErrLeaseLost) {
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

// dueClock is a fakeClock whose timers are due as soon as made.
type dueClock struct{ *fakeClock }

func (c dueClock) NewTimer(d time.Duration) Timer {
	t := c.fakeClock.NewTimer(d)
	c.advance(d)
	return t
}

// TestLeaseGoesByClock: the lease's wait for the fence's lock, and
// created_at, go by the service's clock, not the system's.
func TestLeaseGoesByClock(t *testing.T) {
	c := dueClock{&fakeClock{now: time.Unix(1_000_000, 0)}}
	p := New(Config{Clock: c, Log: zerolog.Nop()})
	if got := p.cfg.Now(); !got.Equal(c.now) {
		t.Errorf("created_at's clock says %v, want the service's %v", got, c.now)
	}
	p.fence.mu.Lock() // a publish in flight
	if p.fence.mu.lockWithin(context.Background(), p.clock, time.Hour) {
		t.Fatal("locked the fence twice")
	}
	p.fence.mu.Unlock()
	if !p.fence.mu.lockWithin(context.Background(), p.clock, time.Hour) {
		t.Fatal("could not lock the free fence")
	}
}

// TestLostStreamRequestSparesLaterLease: the loop asks to stop leading
// on the lease it saw when the plan stream was lost (a standby's: none),
// to look again a TTL later; the leaser took a fresh lease before it read
// the request. That lease stays, and is renewed on time, not a TTL later
// (it would lapse).
func TestLostStreamRequestSparesLaterLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	c := &fakeClock{now: time.Now()}
	p := New(Config{NC: h.nc, JS: h.js, NoService: true, Clock: c, LeaseTTL: 3 * time.Second, Log: zerolog.Nop()})
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	p.fence.elected.Store(true)
	ls := newLeaser(p, zerolog.Nop())
	_, seen := p.fence.held() // standing by when the loop asks
	ls.ask(leaseRequest{epoch: seen, why: "the plan stream was lost", look: true, next: p.cfg.LeaseTTL})
	ls.take(ctx, 0)
	taken := <-ls.events
	if taken.seq == 0 {
		t.Fatal("no lease taken")
	}
	ls.requests(ctx)
	if p.leading() != taken.seq {
		t.Fatal("a request about no lease stepped down from the one taken after it")
	}
	timer := ls.timer.(*fakeTimer)
	if due := timer.at.Sub(c.now); !timer.live || due > ls.every() {
		t.Errorf("the lease held is looked at again in %s, want within the renewal interval %s", due, ls.every())
	}
}
