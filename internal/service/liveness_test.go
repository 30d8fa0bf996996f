package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestPulse: an idle loop is never stuck; a busy one is, once it made
// no progress for the stall, unless it is inside an operation whose
// deadline (and a stall) has not passed; a beat or the operation's end
// is progress.
func TestPulse(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	pl := newPulse(func() time.Time { return now })
	step := func(d time.Duration) { now = now.Add(d) }
	const stall = time.Second
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("a new pulse is stuck")
	}
	step(time.Hour)
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("an idle loop is stuck")
	}
	pl.work("replan")
	step(900 * time.Millisecond)
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("stuck before the stall")
	}
	pl.beat()
	step(900 * time.Millisecond)
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("a beat is no progress")
	}
	step(200 * time.Millisecond)
	d, what, stuck := pl.stuck(stall)
	if !stuck || d != 1100*time.Millisecond || what != "replan" {
		t.Fatalf("past the stall: stuck %v for %s in %q", stuck, d, what)
	}
	// Inside a call with a deadline 10 s out: not stuck until 11 s.
	end := pl.enter("publishing", now.Add(10*time.Second))
	step(10500 * time.Millisecond)
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("stuck inside a call before its deadline and a stall")
	}
	step(time.Second)
	if d, what, stuck := pl.stuck(stall); !stuck || what != "replan: publishing" || d != 11500*time.Millisecond {
		t.Fatalf("past the call's deadline: stuck %v for %s in %q", stuck, d, what)
	}
	end()
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("the call's end is no progress")
	}
	pl.idle()
	step(time.Hour)
	if _, _, stuck := pl.stuck(stall); stuck {
		t.Fatal("idle again, stuck")
	}
}

// hang is a store that hangs when armed: the first bounded call whose
// description starts with prefix blocks, ignoring its deadline until
// released (wedged), or until its deadline (honouring it).
type hang struct {
	prefix  string
	wedge   bool
	armed   atomic.Bool
	hung    atomic.Int64
	release chan struct{}
	once    sync.Once
}

func newHang(prefix string, wedge bool) *hang {
	return &hang{prefix: prefix, wedge: wedge, release: make(chan struct{})}
}

func (h *hang) hook(ctx context.Context, what string) {
	if !h.armed.Load() || !strings.HasPrefix(what, h.prefix) {
		return
	}
	h.hung.Add(1)
	if h.wedge {
		h.armed.Store(false) // once
		<-h.release
		return
	}
	<-ctx.Done()
}

func (h *hang) free() { h.once.Do(func() { close(h.release) }) }

// TestStuckLoopLosesLease: the leader's loop wedges in a store call that
// ignores its deadline. Its lease goroutine stops renewing (it would
// otherwise renew for ever), the standby takes over within the lease's
// TTL and publishes the next revision; the stuck planner says so in its
// health, and when the call returns it stands by: the history stays
// linear.
func TestStuckLoopLosesLease(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	for i := range 4 {
		h.node(fmt.Sprintf("n%02d", i))
	}
	url := h.url()
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, StoreTimeout: 2 * time.Second}
	stuck := newHang("", true)
	acfg := cfg
	acfg.storeHook = stuck.hook
	a := h.instance(url, acfg)
	t.Cleanup(stuck.free) // before a stops (cleanups run last first)
	first := h.waitRevision(1)
	b := h.instance(url, cfg)
	if h.waitLeader(5*time.Second, a, b) != a {
		t.Fatal("the first planner does not lead")
	}

	stuck.armed.Store(true)
	h.kill(first.Workers.At(0).NodeID) // a replans, and wedges
	natstest.WaitFor(t, 10*time.Second, "wedged", func() bool { return stuck.hung.Load() > 0 })
	if h.waitLeader(10*time.Second, b) != b {
		t.Fatal("the standby does not lead")
	}
	second := h.waitRevision(2)
	if sp, err := b.p.plans.Latest(context.Background(), "default"); err != nil || sp.Publisher != b.p.plans.Publisher() {
		t.Fatalf("revision 2 not published by the standby: %v", err)
	}
	natstest.WaitFor(t, 5*time.Second, "the stuck planner standing by, saying why", func() bool {
		health := a.p.Health()
		return !health.Leading && health.Stuck != "" && slices.ContainsFunc(health.Problems, func(s string) bool { return strings.Contains(s, "no progress") })
	})

	stuck.free()
	natstest.WaitFor(t, 5*time.Second, "the planner's loop moving again", func() bool { return a.p.Health().Stuck == "" })
	if a.p.leading() != 0 {
		t.Fatal("the planner that was stuck leads again beside the standby")
	}
	if got := revisions(h.history()); !slices.Equal(got, []int{1, 2}) || !second.Valid() {
		t.Fatalf("history %v", got)
	}
}

// TestStoreCallDeadline: reading a spec's history hangs (a damaged
// bucket). The read gives up at its deadline: the planner plans the
// spec anyway, keeps the lease, and says what it cannot read in its
// health and in its lease, which planner status shows.
func TestStoreCallDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	h.cluster(4, nil)
	slow := newHang("reading the history of plan exp", false)
	slow.armed.Store(true)
	in := h.instance(h.url(), Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1,
		LeaseTTL: time.Second, StoreTimeout: time.Second, storeHook: slow.hook})
	h.waitRevision(1)
	if _, err := store.NewSpecStore(h.js).Put(ctx, "exp", []byte(shareSpec(4, 0))); err != nil {
		t.Fatal(err)
	}
	h.waitFor("exp", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if slow.hung.Load() == 0 {
		t.Fatal("the history read was never made")
	}
	problem := func(ps []string) bool {
		return slices.ContainsFunc(ps, func(s string) bool { return strings.Contains(s, "plan exp: cannot read its spec's history") })
	}
	if health := in.p.Health(); !problem(health.Problems) || !health.Leading {
		t.Fatalf("health %+v", health)
	}
	natstest.WaitFor(t, 5*time.Second, "the problem in the lease", func() bool {
		l, err := store.NewPlanStore(h.js).ReadLease(ctx, bus.LeaseName)
		return err == nil && l != nil && problem(l.Problems)
	})
}

// TestFailingWritesStandDown: every revision the leader publishes fails
// (its store refuses or times out). After StandDownAfter replans it
// gives the lease up and says why; the standby leads and publishes. The
// planner that stood down takes no lease for StandDownBackoff; alone and
// writing again, it leads again and its health clears.
func TestFailingWritesStandDown(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	for i := range 4 {
		h.node(fmt.Sprintf("n%02d", i))
	}
	url := h.url()
	// Each failing publish waits out the store deadline, and the planner
	// that stood down its backoff: both short (the memory store answers
	// at once), the test times neither.
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second,
		StoreTimeout: 500 * time.Millisecond, StandDownAfter: 2, StandDownBackoff: time.Second}
	failing := newHang("publishing plan ", false)
	acfg := cfg
	acfg.storeHook = failing.hook
	a := h.instance(url, acfg)
	first := h.waitRevision(1)
	b := h.instance(url, cfg)
	if h.waitLeader(5*time.Second, a, b) != a {
		t.Fatal("the first planner does not lead")
	}

	failing.armed.Store(true)
	h.kill(first.Workers.At(0).NodeID)
	if h.waitLeader(20*time.Second, b) != b {
		t.Fatal("the standby does not lead")
	}
	second := h.waitRevision(2)
	health := a.p.Health()
	if !strings.Contains(health.StoodDown, "2 replans in a row failed") || health.StoodDownUntil.IsZero() || health.Leading || failing.hung.Load() < 2 {
		t.Fatalf("health of the planner that stood down: %+v (%d publishes failed)", health, failing.hung.Load())
	}

	// Alone, writing again: it leads again once its wait is over, and
	// its first good replan clears the stand-down.
	failing.armed.Store(false)
	b.stop()
	h.waitLeader(10*time.Second, a)
	natstest.WaitFor(t, 10*time.Second, "the stand-down cleared", func() bool { return a.p.Health().StoodDown == "" })
	h.kill(second.Workers.At(0).NodeID)
	if third := h.waitRevision(3); !third.Valid() {
		t.Fatalf("revision 3: %s", third.Error)
	}
}

// corruptSpecs flips bytes in every message block of the spec bucket
// under store dir (a server stopped): the server drops them when it
// starts again.
func corruptSpecs(t *testing.T, dir string) {
	t.Helper()
	blocks, _ := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", "KV_"+client.SpecBucket, "msgs", "*.blk"))
	if len(blocks) == 0 {
		t.Fatal("no spec bucket blocks")
	}
	for _, b := range blocks {
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		for i := 30; i < len(data); i += 7 {
			data[i] ^= 0xff
		}
		if err := os.WriteFile(b, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSpecLostNotReplaced: the spec bucket's file is damaged while the
// server is down, and the server recovers the bucket without the stored
// spec. A planner started with --spec does not silently store its file
// as the plan's spec: it refuses to start, saying why; with
// --replace-spec it stores it.
func TestSpecLostNotReplaced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func() (func(), jetstream.JetStream, *nats.Conn) {
		ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		return func() { nc.Close(); ns.Shutdown(); ns.WaitForShutdown() }, js, nc
	}
	ctx := context.Background()
	stop, js, _ := start()
	specs := store.NewSpecStore(js)
	if _, err := specs.Put(ctx, "default", []byte(shareSpec(8, 3))); err != nil {
		t.Fatal(err)
	}
	stop()
	corruptSpecs(t, dir)
	stop, js, nc := start()
	defer stop()
	if _, _, err := store.NewSpecStore(js).Get(ctx, "default"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the damaged spec reads: %v", err)
	}

	cfg := Config{NC: nc, JS: js, Spec: []byte(testSpec), Settle: -1, Log: zerolog.Nop(), NoService: true}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := New(cfg).Run(rctx)
	if !errors.Is(err, errSpecLost) || !strings.Contains(err.Error(), "--replace-spec") {
		t.Fatalf("planner started on a lost spec: %v", err)
	}
	if _, _, err := store.NewSpecStore(js).Get(ctx, "default"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("--spec stored over the lost spec: %v", err)
	}

	cfg.ReplaceSpec = true
	rctx, cancel = context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(rctx) }()
	natstest.WaitFor(t, 10*time.Second, "--spec stored with --replace-spec", func() bool {
		spec, _, err := store.NewSpecStore(js).Get(ctx, "default")
		return err == nil && string(spec) == testSpec
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRevisionsContinueAfterWipe: a planner publishes revisions 1 and
// 2; it stops, and the server's store is wiped. Started again with its
// state file, it publishes revision 3, saying the history was lost, not
// revision 1 again.
func TestRevisionsContinueAfterWipe(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "revisions.json")
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, StateFile: state}
	r := newRide(t, 4, cfg)
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	gone := first.Workers.At(0).NodeID
	r.crashReporter(gone)
	r.waitPlan(20*time.Second, "revision 2", func(p *planner.Plan) bool { return p.Revision >= 2 && !onNode(p, gone) })
	// The planner marks a revision once its publish is acknowledged,
	// which can be after the stream shows it to the test: stopped in
	// between, its mark is 1, and after the wipe it rightly republishes
	// 2.
	natstest.WaitFor(t, 10*time.Second, "revision 2 marked in the state file", func() bool {
		k := newMarks(state)
		return k.load() == nil && k.get("default") >= 2
	})
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	r.srv.Wipe()

	nc, js := rideConn(t, r.srv.URL())
	cfg.NC, cfg.JS, cfg.Log = nc, js, zerolog.New(&r.logs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	third := r.waitPlan(30*time.Second, "after the wipe", revisionAtLeast(1))
	if third.Revision != 3 || !strings.Contains(third.Reason, "history was lost") {
		t.Fatalf("after the wipe: revision %d, valid %v, reason %q", third.Revision, third.Valid(), third.Reason)
	}
	// The wiped store lost the inventory too: the first plan may have
	// come before the reporters put their nodes again; a valid one
	// follows, numbered on.
	r.waitPlan(30*time.Second, "a valid revision after the wipe", func(p *planner.Plan) bool { return p.Revision >= 3 && p.Valid() })
}

// TestMarks: a plan's high-water mark only rises, survives in its file,
// and a file that cannot be read stops the planner rather than letting
// it number revisions again.
func TestMarks(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sub", "revisions.json")
	k := newMarks(path)
	if err := k.load(); err != nil {
		t.Fatal(err)
	}
	for _, rev := range []int{3, 7, 5} {
		if err := k.raise("a", rev); err != nil {
			t.Fatal(err)
		}
	}
	_ = k.raise("b", 1)
	again := newMarks(path)
	if err := again.load(); err != nil || again.get("a") != 7 || again.get("b") != 1 || again.get("c") != 0 {
		t.Fatalf("read back: a %d, b %d, c %d, %v", again.get("a"), again.get("b"), again.get("c"), err)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := newMarks(path).load(); err == nil {
		t.Fatal("a damaged file reads")
	}
	p := New(Config{StateFile: path, Log: zerolog.Nop()})
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "high-water") {
		t.Fatalf("Run with a damaged state file: %v", err)
	}
}

// TestWipeResumesPlacement: a planner with a state file places 4 nodes'
// workers, replans a node's loss and keeps the node's return (so its
// placement is not what a fresh plan makes); it stops, and the server's
// store is wiped. Started again, it publishes nothing before the nodes
// of its last placement reported again, and then that very placement,
// whole, as the next revision: no invalid revision, no fresh plan
// moving everyone.
func TestWipeResumesPlacement(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "revisions.json")
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 20 * time.Second, LeaseTTL: time.Second, StateFile: state}
	r := newRide(t, 4, cfg)
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	gone := first.Workers.At(0).NodeID
	r.crashReporter(gone)
	last := r.waitPlan(20*time.Second, "revision 2", func(p *planner.Plan) bool { return p.Revision >= 2 && !onNode(p, gone) })
	// Kept once its publish is acknowledged (see TestRevisionsContinueAfterWipe).
	natstest.WaitFor(t, 10*time.Second, "revision 2 kept", func() bool {
		sp, _, err := newMarks(state).kept("default", last.Revision)
		return err == nil && sp != nil
	})
	r.reporter(gone) // back: a node joining moves nobody
	natstest.WaitFor(t, 10*time.Second, gone+" back in the planner's view", func() bool { return len(r.p.view().nodes) == 4 })
	spec, err := planner.ParseSpec([]byte(testSpec))
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := planner.Compute(spec, r.p.view().nodes)
	if err != nil || planner.SamePlacement(fresh, last) {
		t.Fatalf("the test needs a placement a fresh plan does not make: %v", err)
	}
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	r.srv.Wipe()

	nc, js := rideConn(t, r.srv.URL())
	cfg.NC, cfg.JS, cfg.Log = nc, js, zerolog.New(&r.logs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Well within the 20 s settle: the nodes report again, and nothing
	// is published before.
	next := r.waitPlan(15*time.Second, "after the wipe", revisionAtLeast(1))
	if next.Revision != last.Revision+1 || !next.Valid() || !planner.SamePlacement(last, next) || !strings.Contains(next.Reason, "history was lost") {
		t.Fatalf("after the wipe: revision %d (want %d), valid %v, same placement %v, reason %q",
			next.Revision, last.Revision+1, next.Valid(), planner.SamePlacement(last, next), next.Reason)
	}
	if got := revisionsOf(t, r.js); len(got) != 1 {
		t.Fatalf("%d revisions in the new stream, want 1: %v", len(got), revisions(got))
	}
}

// TestHealthIsTheSnapshots: Health says what the loop recorded as of
// the snapshot it last published, never its state in between (a
// snapshot taken keeps its problems as they were), and a stuck loop,
// which publishes nothing, as its pulse says it; the lease carries the
// problems but a stuck stretch the loop recorded (the leaser writes the
// lease only while the loop makes progress).
func TestHealthIsTheSnapshots(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{Clock: c, StallAfter: time.Second, Log: zerolog.Nop()}))
	until := c.now.Add(time.Minute)
	steps := []struct {
		what    string
		do      func()
		publish bool
		want    []string
		failed  int
		stood   string
	}{
		{what: "nothing", do: func() {}, publish: true},
		{what: "recorded, not published", do: func() { p.problem("specs", "no specs") }},
		{what: "published", do: func() {}, publish: true, want: []string{"no specs"}},
		{what: "the same again", do: func() { p.problem("specs", "no specs") }, publish: true, want: []string{"no specs"}},
		{what: "a stuck stretch the leaser told", do: func() { p.problem(stuckKey, "stuck, once") }, publish: true,
			want: []string{"no specs", "stuck, once"}},
		{what: "failures and a stand-down", do: func() {
			p.health.failures = 3
			p.stoodDownFor("writes fail", until)
		}, publish: true, want: []string{"no specs", "stood down: writes fail", "stuck, once"}, failed: 3, stood: "writes fail"},
		{what: "all cleared", do: func() {
			p.problem("specs", "")
			p.problem(stuckKey, "")
			p.problem("never recorded", "")
			p.health.failures = 0
			p.stoodDownFor("", time.Time{})
		}, publish: true},
	}
	for _, st := range steps {
		before := p.view()
		st.do()
		if st.publish {
			p.publishSnapshot(true)
		} else if p.view() != before {
			t.Fatalf("%s: a snapshot published unasked", st.what)
		}
		h := p.Health()
		if !slices.Equal(h.Problems, st.want) || h.Failures != st.failed || h.StoodDown != st.stood {
			t.Errorf("%s: problems %q, failures %d, stood down %q; want %q, %d, %q", st.what, h.Problems, h.Failures, h.StoodDown, st.want, st.failed, st.stood)
		}
		if st.stood != "" && !h.StoodDownUntil.Equal(until) {
			t.Errorf("%s: stood down until %s, want %s", st.what, h.StoodDownUntil, until)
		}
	}

	// A snapshot taken keeps its problems whatever the loop records after.
	p.problem("specs", "no specs")
	p.publishSnapshot(true)
	kept := p.view()
	p.problem("specs", "")
	p.problem("drains", "no drains")
	if got := sortedProblems(kept.health.problems, ""); !slices.Equal(got, []string{"no specs"}) {
		t.Errorf("a published snapshot's problems changed under it: %q", got)
	}

	// Stuck: the loop publishes nothing, the pulse says it.
	p.publishSnapshot(true)
	p.pulse.work("replan")
	c.advance(1500 * time.Millisecond)
	h := p.Health()
	stuck := stuckWhy(1500*time.Millisecond, "replan")
	if h.Stuck == "" || !slices.Equal(h.Problems, []string{"no drains", stuck}) {
		t.Errorf("stuck: %q, problems %q; want %q too", h.Stuck, h.Problems, stuck)
	}
	p.pulse.idle()
	p.problem(stuckKey, stuck) // as the leaser tells it, read once the loop goes on
	p.publishSnapshot(true)
	if h := p.Health(); h.Stuck != "" || !slices.Equal(h.Problems, []string{"no drains", stuck}) {
		t.Errorf("after the stretch, before the leaser's next look: stuck %q, problems %q", h.Stuck, h.Problems)
	}
	if got := p.leaseProblems(); !slices.Equal(got, []string{"no drains"}) {
		t.Errorf("the lease's problems %q, want the stuck stretch left out", got)
	}
}
