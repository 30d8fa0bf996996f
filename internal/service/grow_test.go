package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// skewClock is the wall clock moved ahead by hand (advance): its timers
// fire in real time as the system's do, and at once when an advance
// passes them. Safe for the loop and the test at once.
type skewClock struct {
	mu     sync.Mutex
	offset time.Duration
	timers []*skewTimer
}

type skewTimer struct {
	clock *skewClock
	ch    chan time.Time
	mu    sync.Mutex
	at    time.Time
	live  bool
	real  *time.Timer
}

func (c *skewClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *skewClock) NewTimer(d time.Duration) Timer {
	t := &skewTimer{clock: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

// advance moves the clock d ahead, firing the timers it passes.
func (c *skewClock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	timers := append([]*skewTimer(nil), c.timers...)
	c.mu.Unlock()
	for _, t := range timers {
		t.fire()
	}
}

func (t *skewTimer) C() <-chan time.Time { return t.ch }

func (t *skewTimer) fire() {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.live || now.Before(t.at) {
		return
	}
	t.live = false
	select {
	case t.ch <- now:
	default:
	}
}

// hurrying is cond with the clock moved step ahead before each check: a
// wait (natstest.WaitFor) on it passes the clock's time some ten times as
// fast as the wall's, for a wait on a timer the test does not time.
func (c *skewClock) hurrying(step time.Duration, cond func() bool) func() bool {
	return func() bool {
		c.advance(step)
		return cond()
	}
}

// Stop and Reset leave no stale tick in the channel, as Go's timers do.
func (t *skewTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.live
	t.live = false
	if t.real != nil {
		t.real.Stop()
	}
	select {
	case <-t.ch:
	default:
	}
	return was
}

func (t *skewTimer) Reset(d time.Duration) bool {
	was := t.Stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.at, t.live = t.clock.Now().Add(d), true
	t.real = time.AfterFunc(max(d, 0), t.fire)
	return was
}

const elasticSpecA = `scheduling:
  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}
  eval:  {worker_num: {min: 4, max: 32}, num_cpus: 1, num_gpus: 1}
`

// TestElasticService is the story: 4x8 H100s; plan a (train 8,
// eval 4..32) grows to 24 eval once the GPUs have been free for
// grow-after; b (priority 10, 12 GPUs) makes a shrink to 12 eval (still
// valid, train unmoved), a's revision before b's; the node of a's train
// dies and a heals from its eval surplus without a degraded revision;
// b removed, a grows back to 16; then several grow-after periods pass
// with nothing published.
func TestElasticService(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	specs := h.cluster(4, map[string]string{"a": elasticSpecA})
	clock := &skewClock{}
	const after = 30 * time.Second
	reg := prometheus.NewRegistry()
	h.reg = reg
	p := New(Config{NC: h.nc, JS: h.js, Debounce: 50 * time.Millisecond, Settle: -1, NoService: true, Log: zerolog.Nop(),
		Clock: clock, GrowAfter: after, LeaseTTL: time.Hour, StallAfter: time.Hour, Metrics: metrics.NewPlanner(reg)})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	plans := store.NewPlanStore(h.js)
	latest := func(name string, what string, ok func(*store.StoredPlan) bool) *store.StoredPlan {
		t.Helper()
		var last *store.StoredPlan
		natstest.WaitFor(t, 20*time.Second, "plan "+name+": "+what, func() bool {
			sp, err := plans.Latest(ctx, name)
			if err != nil || sp == nil {
				return false
			}
			last = sp
			return ok(sp)
		})
		return last
	}
	evals := func(sp *store.StoredPlan) int { return count(sp.Plan, plan.Eval) }

	first := latest("a", "valid at its minimum", func(sp *store.StoredPlan) bool { return sp.Plan.Valid() && evals(sp) == 4 })
	idle(t, p)
	clock.advance(after + time.Second)
	grown := latest("a", "grown to 24 eval", func(sp *store.StoredPlan) bool { return evals(sp) == 24 })
	if !grown.Plan.Valid() || grown.Plan.Revision != first.Plan.Revision+1 || !strings.Contains(grown.Plan.Reason, "grew eval 4 -> 24") {
		t.Fatalf("grown: revision %d after %d, valid %v, reason %q", grown.Plan.Revision, first.Plan.Revision, grown.Plan.Valid(), grown.Plan.Reason)
	}
	trainAt := componentPlaces(grown.Plan, plan.Train)

	if _, err := specs.Put(ctx, "b", []byte(shareSpec(12, 10))); err != nil {
		t.Fatal(err)
	}
	b := latest("b", "valid", func(sp *store.StoredPlan) bool { return sp.Plan.Valid() })
	shrunk := latest("a", "shrunk", func(sp *store.StoredPlan) bool { return evals(sp) != 24 })
	st := shrunk.Plan.Status
	if !shrunk.Plan.Valid() || evals(shrunk) != 12 || st.Reason != plan.ReasonShrunk || !strings.Contains(shrunk.Plan.Reason, "shrank eval 24 -> 12 for plan b") {
		t.Fatalf("a with b: valid %v, eval %d, status %+v, reason %q", shrunk.Plan.Valid(), evals(shrunk), st, shrunk.Plan.Reason)
	}
	if got := componentPlaces(shrunk.Plan, plan.Train); got != trainAt {
		t.Fatalf("a's train moved: %s, was %s", got, trainAt)
	}
	if shrunk.Seq > b.Seq {
		t.Fatalf("b's revision (seq %d) published before a's release (seq %d)", b.Seq, shrunk.Seq)
	}
	shared(t, shrunk.Plan, b.Plan)

	// The node of a's train dies: a heals from its eval surplus.
	h.kill(shrunk.Plan.Workers.Find(plan.Train, 0).NodeID)
	healed := latest("a", "healed", func(sp *store.StoredPlan) bool { return sp.Plan.Revision > shrunk.Plan.Revision })
	if !healed.Plan.Valid() || evals(healed) != 4 || count(healed.Plan, plan.Train) != 8 || !strings.Contains(healed.Plan.Reason, "shrank eval 12 -> 4 to re-place its own workers") {
		t.Fatalf("after the loss: %s, eval %d, reason %q", healed.Plan.PlanState(), evals(healed), healed.Plan.Reason)
	}
	bNow := latest("b", "any", func(*store.StoredPlan) bool { return true })
	if bNow.Plan.Revision != b.Plan.Revision {
		t.Fatalf("b republished: %s", bNow.Plan.Reason)
	}
	shared(t, healed.Plan, bNow.Plan)

	// b goes: a grows back once its GPUs have been free for grow-after.
	if err := specs.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	latest("b", "removed", func(sp *store.StoredPlan) bool { return sp.Plan.Removed() })
	idle(t, p)
	clock.advance(after + time.Second)
	back := latest("a", "grown back", func(sp *store.StoredPlan) bool { return sp.Plan.Revision > healed.Plan.Revision })
	if !back.Plan.Valid() || evals(back) != 16 || !strings.Contains(back.Plan.Reason, "grew eval 4 -> 16") {
		t.Fatalf("b gone: %s eval %d, reason %q", back.Plan.PlanState(), evals(back), back.Plan.Reason)
	}

	// Quiet: several grow-after periods, nothing published.
	for range 4 {
		idle(t, p)
		clock.advance(after + time.Second)
	}
	idle(t, p)
	if now := latest("a", "any", func(*store.StoredPlan) bool { return true }); now.Plan.Revision != back.Plan.Revision {
		t.Fatalf("a quiet cluster published revision %d: %s", now.Plan.Revision, now.Plan.Reason)
	}
	history := 0
	if err := plans.Client().History(ctx, "a", func(i client.Info) bool {
		history++
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if history != back.Plan.Revision {
		t.Fatalf("%d revisions of a, want %d", history, back.Plan.Revision)
	}
	got := scraped(t, reg)
	for k, want := range map[string]float64{
		`poolplanner_plan_elastic_workers{component="eval",plan="a"}`:                          16,
		`poolplanner_plan_elastic_resizes_total{component="eval",direction="grow",plan="a"}`:   2,
		`poolplanner_plan_elastic_resizes_total{component="eval",direction="shrink",plan="a"}`: 2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func idle(t *testing.T, p *Service) {
	t.Helper()
	ictx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Idle(ictx); err != nil {
		t.Fatalf("not idle: %v", err)
	}
}

func count(p *planner.Plan, c plan.Component) int {
	n := 0
	for _, w := range p.Workers.All() {
		if w.Component == c {
			n++
		}
	}
	return n
}

// places is where p's workers of c are, in index order.
func componentPlaces(p *planner.Plan, c plan.Component) string {
	var b strings.Builder
	for _, w := range p.Workers.All() {
		if w.Component == c {
			fmt.Fprintf(&b, "%d@%s%v ", w.Index, w.NodeID, w.GPUs)
		}
	}
	return b.String()
}

// shared fails when a GPU is in two of the plans.
func shared(t *testing.T, plans ...*planner.Plan) {
	t.Helper()
	owner := map[string]string{}
	for _, p := range plans {
		for _, w := range p.Workers.All() {
			for _, g := range w.GPUs {
				k := fmt.Sprintf("%s:%d", w.NodeID, g)
				if o, ok := owner[k]; ok && o != p.Name {
					t.Fatalf("GPU %s in plans %s and %s", k, o, p.Name)
				}
				owner[k] = p.Name
			}
		}
	}
}

// TestElasticValidate: validation answers with the sizes the next
// revision has. a (train 8, eval 4..32) on 4x8 GPUs: its own spec
// validated before its GPUs have been free for grow-after stays at eval
// 4, as the loop's next replan would; grown to 24, a new plan of its
// priority of 12 GPUs validates (a gives up surplus for it, as the
// replan does) and, stored, is placed with a shrunk to 12; one of 21
// GPUs is refused, a's minimum leaving 20.
func TestElasticValidate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	specs := h.cluster(4, map[string]string{"a": elasticSpecA})
	clock := &skewClock{}
	const after = 30 * time.Second
	p := New(Config{NC: h.nc, JS: h.js, Debounce: 50 * time.Millisecond, Settle: -1, NoService: true, Log: zerolog.Nop(),
		Clock: clock, GrowAfter: after, LeaseTTL: time.Hour, StallAfter: time.Hour})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	h.waitFor("a", "valid at its minimum", func(p *planner.Plan) bool { return p.Valid() && count(p, plan.Eval) == 4 })
	idle(t, p)

	own, err := p.Validate(ctx, []byte(elasticSpecA), "a")
	if err != nil || !own.Valid() || docCount(own.Document, plan.Eval) != 4 {
		t.Fatalf("a's own spec before grow-after: %+v, %v; want valid, eval 4", own, err)
	}

	clock.advance(after + time.Second)
	h.waitFor("a", "grown to 24 eval", func(p *planner.Plan) bool { return count(p, plan.Eval) == 24 })
	idle(t, p)
	for _, tc := range []struct {
		gpus  int
		valid bool
		err   string
	}{
		{gpus: 12, valid: true},
		{gpus: 21, err: "required 21.0, available 20"},
	} {
		r, err := p.Validate(ctx, []byte(shareSpec(tc.gpus, 0)), "b")
		if err != nil {
			t.Fatal(err)
		}
		if r.Valid() != tc.valid || !strings.Contains(r.Error, tc.err) {
			t.Fatalf("b of %d GPUs beside a grown: valid %v, error %q; want valid %v, error saying %q", tc.gpus, r.Valid(), r.Error, tc.valid, tc.err)
		}
		if tc.valid && docCount(r.Document, plan.Train) != tc.gpus {
			t.Fatalf("b of %d GPUs: %d train workers in the reply", tc.gpus, docCount(r.Document, plan.Train))
		}
	}
	// A new elastic plan gets its minimum: the GPUs a's shrink frees
	// were held, so none has been free for grow-after.
	const elasticC = "scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: {min: 2, max: 8}, num_cpus: 1, num_gpus: 1}\n"
	c, err := p.Validate(ctx, []byte(elasticC), "c")
	want := "elastic: the minimum needs 6 GPUs in all; the cluster would give eval 2 of 2..8 now (6 GPUs)"
	if err != nil || !c.Valid() || docCount(c.Document, plan.Eval) != 2 || !slices.Contains(c.Warnings, want) {
		t.Fatalf("new elastic c beside a grown: %v; valid %v, eval %d, warnings %q; want valid, eval 2, %q", err, c.Valid(), docCount(c.Document, plan.Eval), c.Warnings, want)
	}
	if _, err := specs.Put(ctx, "b", []byte(shareSpec(12, 0))); err != nil {
		t.Fatal(err)
	}
	h.waitFor("b", "valid", func(p *planner.Plan) bool { return p.Valid() && count(p, plan.Train) == 12 })
	h.waitFor("a", "shrunk to 12 eval for b", func(p *planner.Plan) bool { return p.Valid() && count(p, plan.Eval) == 12 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// docCount is how many workers of component c d places.
func docCount(d *plan.Document, c plan.Component) int {
	n := 0
	for _, w := range d.Workers.All() {
		if w.Component == c {
			n++
		}
	}
	return n
}

// TestGrowAfterFailedPublish: a replan's growth whose revision fails to
// publish holds nothing: its GPUs stay free since they were, and the
// retry grows onto them at once, not another grow-after later.
func TestGrowAfterFailedPublish(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.cluster(4, map[string]string{"a": elasticSpecA})
	clock := &skewClock{}
	const after = time.Minute
	failing := newHang("publishing plan ", false)
	p := New(Config{NC: h.nc, JS: h.js, Debounce: 50 * time.Millisecond, Settle: -1, NoService: true,
		Clock: clock, GrowAfter: after, LeaseTTL: 2 * time.Second, StallAfter: time.Hour, StoreTimeout: time.Second,
		StandDownAfter: 100, storeHook: failing.hook, Log: zerolog.Nop()})
	h.mem.onMem(p)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	first := h.waitFor("a", "valid at its minimum", func(p *planner.Plan) bool { return p.Valid() && count(p, plan.Eval) == 4 })
	idle(t, p)

	failing.armed.Store(true)
	clock.advance(after + time.Second)
	natstest.WaitFor(t, 10*time.Second, "the grown revision's publish failing", func() bool { return failing.hung.Load() > 0 })
	failing.armed.Store(false)
	// The retry (a backoff of a few seconds) grows at once: well within
	// grow-after, which the clock is not moved by again.
	grown := h.waitFor("a", "grown to 24 eval", func(p *planner.Plan) bool { return count(p, plan.Eval) == 24 })
	if grown.Revision != first.Revision+1 || !strings.Contains(grown.Reason, "grew eval 4 -> 24") {
		t.Fatalf("grown: revision %d after %d, reason %q", grown.Revision, first.Revision, grown.Reason)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestGrowDueGated: the grow timer's replan goes through kick's gates
// and debounce, as any change does: none is armed while the inventory
// resyncs or a failed replan's backoff runs (its retry replans), and
// the loop's close stops the grow timer too.
func TestGrowDueGated(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.cluster(1, map[string]string{"a": elasticSpecA})
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	const debounce = 50 * time.Millisecond
	p := drive(New(Config{NC: h.nc, JS: h.js, Clock: c, Debounce: debounce, NoService: true, Log: zerolog.Nop()}))
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	spec, err := planner.ParseSpec([]byte(elasticSpecA))
	if err != nil {
		t.Fatal(err)
	}
	p.addState("a").spec = spec
	for _, tc := range []struct {
		what     string
		synced   bool
		failures int
		armed    bool
	}{
		{what: "in sync", synced: true, armed: true},
		{what: "resyncing", synced: false},
		{what: "backing off a failure", synced: true, failures: 1},
	} {
		l, err := p.newLoop(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.synced, l.specsIn, l.p.drain.in, l.p.health.failures = tc.synced, true, true, tc.failures
		l.growDue()
		ft := l.timer.(*fakeTimer)
		if !l.dirty || l.armed != tc.armed || ft.live != tc.armed || tc.armed && !ft.at.Equal(c.now.Add(debounce)) {
			t.Errorf("%s: grow due: dirty %v, replan armed %v (timer live %v, at +%s); want dirty, armed %v, at +%s",
				tc.what, l.dirty, l.armed, ft.live, ft.at.Sub(c.now), tc.armed, debounce)
		}
		l.growT.Reset(time.Minute)
		l.close()
		if l.growT.(*fakeTimer).live {
			t.Errorf("%s: the grow timer is live after close", tc.what)
		}
	}
}
