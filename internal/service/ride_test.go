package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
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
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

// rideConn connects as a long-lived client does: reconnecting for ever.
func rideConn(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := bus.Connect(url, "test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return nc, js
}

// ride is a planner and real reporters, each on a connection of its own,
// against one server.
type ride struct {
	t    *testing.T
	srv  *natstest.Server
	js   jetstream.JetStream // the test's own
	logs syncBuffer
	mu   sync.Mutex
	reps map[string]context.CancelFunc
	stop context.CancelFunc
	done chan error
	// proxy stands between the planner and the server, to cut it off.
	proxy *proxy
	// p is the planner; reg, its metrics.
	p   *Service
	reg *prometheus.Registry
}

func newRide(t *testing.T, nodes int, cfg Config) *ride {
	t.Helper()
	r := &ride{t: t, srv: natstest.Start(t), reps: map[string]context.CancelFunc{}, done: make(chan error, 1)}
	_, r.js = rideConn(t, r.srv.URL())
	for i := range nodes {
		r.reporter(fmt.Sprintf("n%02d", i))
	}
	// The nodes are in before the planner starts: its first revision
	// plans on all of them, and no other follows while nothing changes.
	inv := store.NewInventoryStore(r.js)
	natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d nodes in the inventory", nodes), func() bool {
		docs, err := inv.List(context.Background())
		return err == nil && len(docs) == nodes
	})
	r.proxy = newProxy(t, r.srv.Addr())
	nc, js := rideConn(t, "nats://"+r.proxy.addr)
	cfg.NC, cfg.JS, cfg.Log = nc, js, zerolog.New(&r.logs)
	r.reg = prometheus.NewRegistry()
	cfg.Metrics = metrics.NewPlanner(r.reg)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	r.p = New(cfg)
	go func() { r.done <- r.p.Run(ctx) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("planner log:\n%s", r.logs.String())
		}
		cancel()
		r.mu.Lock()
		for _, c := range r.reps {
			c()
		}
		r.mu.Unlock()
	})
	return r
}

// quickGuard is the guard round (Config.guardRound) of tests that wait
// for what a round does: short, yet long enough that the rounds' store
// calls do not crowd a loaded machine.
const quickGuard = 300 * time.Millisecond

// reporter runs a real reporter for node id (8 H100s; heartbeat 300ms,
// TTL 1s) on a connection of its own.
func (r *ride) reporter(id string) {
	_, js := rideConn(r.t, r.srv.URL())
	sim, _ := inventory.ParseSimulation("8xH100")
	src := inventory.NewSimulated(inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}, sim)
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	r.reps[id] = cancel
	r.mu.Unlock()
	go func() {
		_ = reporter.Run(ctx, reporter.Config{Source: src, Store: store.NewInventoryStore(js), Heartbeat: 300 * time.Millisecond,
			TTL: time.Second, Log: zerolog.Nop()})
	}()
}

// crashReporter stops id's reporter without deleting its key (a dead
// host): the key expires.
func (r *ride) crashReporter(id string) {
	// Cancelling makes Run delete the key; a dead host does not. Stop
	// its heartbeats by closing its connection first.
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reps[id]()
}

// waitPlan waits for a revision of at least rev that satisfies ok.
func (r *ride) waitPlan(within time.Duration, what string, ok func(*planner.Plan) bool) *planner.Plan {
	r.t.Helper()
	plans := store.NewPlanStore(r.js)
	var p *planner.Plan
	natstest.WaitFor(r.t, within, "a plan "+what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		sp, err := plans.Latest(ctx, "default")
		if err == nil && sp != nil && ok(sp.Plan) {
			p = sp.Plan
		}
		return p != nil
	})
	return p
}

func revisionAtLeast(rev int) func(*planner.Plan) bool {
	return func(p *planner.Plan) bool { return p.Revision >= rev }
}

// TestOutageLongerThanTTL: NATS is away for longer than the keys' TTL,
// so every key has expired when it comes back. No node died: the planner
// waits for the reporters to put their keys again, as after a restart,
// and moves nobody.
func TestOutageLongerThanTTL(t *testing.T) {
	t.Parallel()
	r := newRide(t, 4, Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 5 * time.Second, LeaseTTL: time.Second,
		guardRound: quickGuard})
	r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	r.srv.Stop()
	// The outage is the scenario: a span of time with the server away,
	// longer than the 1s TTL, so that every key expires; nothing can be
	// watched meanwhile.
	time.Sleep(2500 * time.Millisecond)
	r.srv.Start()
	// Back, the planner notices the reconnect (its guard, each round) and
	// re-reads the inventory (counted, by why), waits (the settle, 5 s
	// at most) for its nodes to report again, and replans; then it is
	// idle.
	waitScraped(t, r.reg, "the planner re-reading the inventory", func(m map[string]float64) bool {
		return m[`poolplanner_inventory_resyncs_total{why="reconnect"}`] > 0
	})
	ictx, icancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer icancel()
	if err := r.p.Idle(ictx); err != nil {
		t.Fatalf("the planner not idle after the outage: %v (health %+v)", err, r.p.Health())
	}
	for _, p := range revisionsOf(t, r.js) {
		if p.Revision > 1 && (p.Moved > 0 || !p.Valid()) {
			t.Errorf("revision %d after an outage: valid %v, moved %d (%s)", p.Revision, p.Valid(), p.Moved, p.Reason)
		}
	}
}

// TestCutOffMissesExpiry: the planner is cut off from NATS while a node
// dies and its key expires; after the reconnect it re-reads the
// inventory and replans without the node.
func TestCutOffMissesExpiry(t *testing.T) {
	t.Parallel()
	r := newRide(t, 4, Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second})
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	victim := first.Workers.At(0).NodeID
	r.proxy.cut(true)
	r.crashReporter(victim)
	kv, err := store.NewInventoryStore(r.js).KV(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, victim+"'s key expired", func() bool {
		_, err := kv.Get(context.Background(), victim)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	r.proxy.cut(false)
	p := r.waitPlan(15*time.Second, "without the dead node", func(p *planner.Plan) bool {
		return p.Revision >= 2 && !onNode(p, victim)
	})
	if !p.Valid() {
		t.Fatalf("revision %d: %s", p.Revision, p.Error)
	}
}

// revisionsOf is every revision of the default plan.
func revisionsOf(t *testing.T, js jetstream.JetStream) []*planner.Plan {
	t.Helper()
	h := &harness{t: t, js: js}
	return h.history()
}

// proxy forwards TCP connections to a server until cut.
type proxy struct {
	t     *testing.T
	addr  string
	to    string
	mu    sync.Mutex
	off   bool
	conns []net.Conn
}

func newProxy(t *testing.T, to string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, addr: l.Addr().String(), to: to}
	t.Cleanup(func() { l.Close(); p.cut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	off := p.off
	p.mu.Unlock()
	if off {
		c.Close()
		return
	}
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	go func() { _, _ = copyConn(s, c) }()
	_, _ = copyConn(c, s)
}

func copyConn(dst, src net.Conn) (int64, error) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err != nil {
			return n, err
		}
	}
}

// cut drops every connection and refuses new ones (off), or lets them
// through again.
func (p *proxy) cut(off bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.off = off
	if off {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestWipedStore: the plan stream, the inventory and spec buckets and
// the assignments are deleted by hand, and later the server restarts
// with its store wiped. Each time the planner logs the loss as an error,
// recreates the streams, puts its spec back, and publishes its plan as
// the next revision, whole, continuing the sequence; it never stops.
func TestWipedStore(t *testing.T) {
	t.Parallel()
	r := newRide(t, 4, Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 3 * time.Second, LeaseTTL: time.Second})
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	ctx := context.Background()
	for _, name := range []string{client.PlansStream, bus.InventoryStream, "KV_" + client.SpecBucket, "POOLPLANNER_ASSIGNMENTS"} {
		if err := r.js.DeleteStream(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	second := r.waitPlan(20*time.Second, "after the streams were deleted", revisionAtLeast(2))
	if second.Revision != 2 || !second.Valid() || !strings.Contains(second.Reason, "history was lost") || !planner.SamePlacement(first, second) {
		t.Fatalf("after deleting the streams: revision %d, valid %v, reason %q, same placement %v", second.Revision, second.Valid(), second.Reason, planner.SamePlacement(first, second))
	}
	checkSpecBack(t, r.js)
	settled(t, r, first)

	r.srv.Wipe()
	third := r.waitPlan(30*time.Second, "after the store was wiped", revisionAtLeast(1))
	if third.Revision != 3 || !third.Valid() || !planner.SamePlacement(first, third) {
		t.Fatalf("after a wiped store: revision %d, valid %v, reason %q", third.Revision, third.Valid(), third.Reason)
	}
	checkSpecBack(t, r.js)
	select {
	case err := <-r.done:
		t.Fatalf("the planner stopped: %v", err)
	default:
	}
	if !strings.Contains(third.Reason, "history was lost") {
		t.Errorf("revision 3 does not say the history was lost: %q", third.Reason)
	}
	settled(t, r, first)
}

// settled waits until every reporter put its node again and the planner
// is idle on them, then checks that the plan stream holds no revision
// but ones of first's placement, valid: the planner published nothing
// on the inventory it lost before it read it again.
func settled(t *testing.T, r *ride, first *planner.Plan) {
	t.Helper()
	inv := store.NewInventoryStore(r.js)
	natstest.WaitFor(t, 10*time.Second, "every node reported again", func() bool {
		docs, err := inv.List(context.Background())
		return err == nil && len(docs) == 4
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.p.Idle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range revisionsOf(t, r.js) {
		if !p.Valid() || !planner.SamePlacement(first, p) {
			t.Errorf("revision %d: valid %v, same placement %v, reason %q", p.Revision, p.Valid(), planner.SamePlacement(first, p), p.Reason)
		}
	}
}

func checkSpecBack(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	spec, _, err := store.NewSpecStore(js).Get(ctx, "default")
	if err != nil || string(spec) != testSpec {
		t.Errorf("spec not put back: %q %v", spec, err)
	}
}

// TestLastGoodSpec: a planner started without a spec of its own while
// the stored spec does not parse plans on the newest one that does,
// says so, and takes the next good spec stored.
func TestLastGoodSpec(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := rideConn(t, srv.URL())
	ctx := context.Background()
	specs := store.NewSpecStore(js)
	if _, err := specs.Put(ctx, "default", []byte(testSpec)); err != nil {
		t.Fatal(err)
	}
	// Stored behind the spec store's check, as an older planner or the
	// nats CLI could.
	kv, err := specs.KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "default", []byte("scheduling: {train: {worker_num: -1}}")); err != nil {
		t.Fatal(err)
	}
	r := &ride{t: t, srv: srv, js: js, reps: map[string]context.CancelFunc{}, done: make(chan error, 1)}
	for i := range 4 {
		r.reporter(fmt.Sprintf("n%02d", i))
	}
	nc, pjs := rideConn(t, srv.URL())
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		r.done <- New(Config{NC: nc, JS: pjs, Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, Log: zerolog.New(&r.logs)}).Run(pctx)
	}()
	first := r.waitPlan(20*time.Second, "on the last good spec", revisionAtLeast(1))
	if !first.Valid() || first.Workers.Len() == 0 {
		t.Fatalf("revision 1: valid %v, %d workers", first.Valid(), first.Workers.Len())
	}
	// The leader's lease says what it finds wrong: the stored spec.
	natstest.WaitFor(t, 10*time.Second, "the lease naming the spec that does not parse", func() bool {
		l, err := store.NewPlanStore(js).ReadLease(ctx, "default")
		return err == nil && l != nil && slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, "does not parse") })
	})
	smaller := strings.Replace(testSpec, "worker_num: 8", "worker_num: 4", 1)
	if _, err := specs.Put(ctx, "default", []byte(smaller)); err != nil {
		t.Fatal(err)
	}
	r.waitPlan(10*time.Second, "on the new spec", func(p *planner.Plan) bool { return p.Revision == 2 && p.Valid() })
}

// TestSpecPrecedence: serve --spec seeds a plan that has no spec; a spec
// set since wins over the file at the next start, said in a warning,
// unless ReplaceSpec.
func TestSpecPrecedence(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	other := strings.Replace(testSpec, "worker_num: 8", "worker_num: 4", 1)
	seed := func(replace bool) string {
		t.Helper()
		p := New(Config{NC: h.nc, JS: h.js, Spec: []byte(testSpec), ReplaceSpec: replace, Log: zerolog.Nop()})
		if _, err := p.start(ctx); err != nil {
			t.Fatal(err)
		}
		got, _, err := store.NewSpecStore(h.js).Get(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		return string(got)
	}
	if got := seed(false); got != testSpec {
		t.Fatalf("a plan without a spec: got %q", got)
	}
	if _, err := store.NewSpecStore(h.js).Put(ctx, "default", []byte(other)); err != nil { // planner spec set
		t.Fatal(err)
	}
	if got := seed(false); got != other {
		t.Fatalf("restart with --spec after spec set: stored %q, want the one spec set stored", got)
	}
	if got := seed(true); got != testSpec {
		t.Fatalf("--replace-spec: stored %q", got)
	}
}
