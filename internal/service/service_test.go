package service

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

const testSpec = `
scheduling:
  train:  {worker_num: 8, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 1, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 4, num_cpus: 1, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

type harness struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	// reg is the metrics of the newest planner plannerWith started
	// (replans and waitReplans read it), newest that planner.
	reg    *prometheus.Registry
	newest *Service
	// beats keeps simulated nodes alive; cancel one to let it expire.
	mu    sync.Mutex
	beats map[string]context.CancelFunc
	// ttl is the simulated nodes' key TTL (0: a second). A test that
	// must see no node expire on a loaded machine, where a heartbeat may
	// come seconds late, gives a longer one.
	ttl time.Duration
	// mem, when set, is the stores the planners use instead of srv's
	// (newMemHarness): srv, nc and js are then nil.
	mem *memJS
}

// newMemHarness is a harness whose planners run on an in-memory store
// (memJS) on the system's clock: for tests of the loop's behaviour, not
// of the wire.
func newMemHarness(t *testing.T) *harness {
	t.Helper()
	return newMemHarnessOn(t, systemClock{})
}

// newMemHarnessOn is newMemHarness on clock: the store's, and its
// planners' unless their Config names another. A test on a clock it
// moves (skewClock) passes a deadline or a wait at once.
func newMemHarnessOn(t *testing.T, clock Clock) *harness {
	t.Helper()
	h := &harness{t: t, mem: newMemJS(clock), beats: map[string]context.CancelFunc{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.beats {
			c()
		}
	})
	return h
}

// newHarness starts the harness's server (natstest's, with opts).
func newHarness(t *testing.T, opts ...natstest.Option) *harness {
	t.Helper()
	srv := natstest.Start(t, opts...)
	nc := srv.Conn(t)
	js, _ := jetstream.New(nc)
	h := &harness{t: t, srv: srv, nc: nc, js: js, beats: map[string]context.CancelFunc{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.beats {
			c()
		}
	})
	return h
}

// node starts a simulated reporter for id: 8 H100s, a 1s TTL (h.ttl),
// a heartbeat every 300ms.
func (h *harness) node(id string) {
	h.t.Helper()
	doc := simDoc(id)
	ctx, cancel := context.WithCancel(context.Background())
	ttl := cmp.Or(h.ttl, time.Second)
	put := func(heartbeat bool) error {
		_, err := store.NewInventoryStore(h.js).Put(ctx, id, doc, heartbeat, ttl)
		return err
	}
	if h.mem != nil {
		var n inventory.NodeInventory
		if err := json.Unmarshal(doc, &n); err != nil {
			h.t.Fatal(err)
		}
		put = func(heartbeat bool) error {
			_, err := memInventory{h.mem.inv}.put(n, heartbeat, ttl)
			return err
		}
	}
	if err := put(false); err != nil {
		cancel()
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.beats[id] = cancel
	h.mu.Unlock()
	go func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = put(true)
			}
		}
	}()
}

// heartbeats waits until every live simulated node has put its key
// again (a heartbeat since the call).
func (h *harness) heartbeats() {
	h.t.Helper()
	ctx := context.Background()
	kv := h.inventory()
	h.mu.Lock()
	var ids []string
	for id := range h.beats {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	was := map[string]uint64{}
	for _, id := range ids {
		if e, err := kv.Get(ctx, id); err == nil {
			was[id] = e.Revision()
		}
	}
	natstest.WaitFor(h.t, 15*time.Second, "every live node's heartbeat", func() bool {
		for id, rev := range was {
			if e, err := kv.Get(ctx, id); err != nil || e.Revision() <= rev {
				return false
			}
		}
		return true
	})
}

// kill stops id's heartbeats without deleting its key: it expires (on
// memJS at once, as if its TTL had passed).
func (h *harness) kill(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beats[id]()
	if h.mem != nil {
		memInventory{h.mem.inv}.expire(id)
	}
}

func (h *harness) planner(ctx context.Context, spec string) context.CancelFunc {
	return h.plannerWith(ctx, Config{Spec: []byte(spec), Debounce: 50 * time.Millisecond, Settle: -1})
}

func (h *harness) plannerWith(ctx context.Context, cfg Config) context.CancelFunc {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	cfg.NC, cfg.JS, cfg.Log = h.nc, h.js, zerolog.Nop()
	if cfg.Metrics == nil {
		h.reg = prometheus.NewRegistry()
		cfg.Metrics = metrics.NewPlanner(h.reg)
	}
	if h.mem != nil {
		cfg.NoService = true // requests are the wire's, tested on NATS
		if cfg.Clock == nil {
			cfg.Clock = h.mem.clock
		}
	}
	p := New(cfg)
	h.newest = p
	if h.mem != nil {
		h.mem.onMem(p)
	}
	go func() {
		defer close(done)
		if err := p.Run(ctx); err != nil {
			h.t.Errorf("planner: %v", err)
		}
	}()
	return func() { cancel(); <-done }
}

// history is every revision of the default plan, each rebuilt whole.
func (h *harness) history() []*planner.Plan {
	h.t.Helper()
	var revs []int
	var plans planStore
	if h.mem != nil {
		plans = h.mem.plans("")
		revs = h.mem.revisions("default")
	} else {
		ps := store.NewPlanStore(h.js)
		plans = jsPlans{ps}
		err := ps.Client().History(context.Background(), "default", func(i client.Info) bool {
			revs = append(revs, i.Revision)
			return true
		})
		if err != nil {
			h.t.Fatal(err)
		}
	}
	var out []*planner.Plan
	for _, rev := range revs {
		sp, err := plans.Revision(context.Background(), "default", rev)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, sp.Plan)
	}
	return out
}

// waitRevision waits for revision rev of the default plan; it fails
// when a later one comes first.
func (h *harness) waitRevision(rev int) *planner.Plan {
	h.t.Helper()
	var p *planner.Plan
	// Bounds here are what a loaded machine (load 10, -race) needs, not
	// what a test takes: a condition met returns at once.
	natstest.WaitFor(h.t, 30*time.Second, fmt.Sprintf("revision %d", rev), func() bool {
		sp, err := h.plans().Latest(context.Background(), "default")
		if err != nil || sp == nil || sp.Plan.Revision < rev {
			return false
		}
		if sp.Plan.Revision != rev {
			h.t.Fatalf("revision %d, want %d", sp.Plan.Revision, rev)
		}
		p = sp.Plan
		return true
	})
	return p
}

// replans is how many replans of plan the newest planner finished, and
// how many of those published a revision (its replan and
// change-to-publish histograms' counts). A replan that found nothing to
// publish counts too: after one that began after a change, anything the
// change would publish is published.
func (h *harness) replans(plan string) (done, published int) {
	h.t.Helper()
	got := scraped(h.t, h.reg)
	return int(got[fmt.Sprintf("poolplanner_replan_duration_seconds{plan=%q}", plan)]),
		int(got[fmt.Sprintf("poolplanner_inventory_change_to_publish_seconds{plan=%q}", plan)])
}

// waitReplans waits until the newest planner finished at least n
// replans of plan.
func (h *harness) waitReplans(plan string, n int) {
	h.t.Helper()
	natstest.WaitFor(h.t, 30*time.Second, fmt.Sprintf("%d replans of %s", n, plan), func() bool {
		done, _ := h.replans(plan)
		return done >= n
	})
}

// waitPublished waits until the newest planner finished the replan
// that published its nth revision of plan, and returns how many replans
// of plan it finished by then.
func (h *harness) waitPublished(plan string, n int) int {
	h.t.Helper()
	var done int
	natstest.WaitFor(h.t, 30*time.Second, fmt.Sprintf("%d revisions of %s published", n, plan), func() bool {
		var published int
		done, published = h.replans(plan)
		return published >= n
	})
	return done
}

func TestServiceEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// On a loaded machine a heartbeat may come seconds late, and a
	// planner's loop stall for seconds: no node may expire but the one
	// killed, and no standby take the lease from the leader (which would
	// then never publish the revision waited for below).
	h.ttl = 5 * time.Second
	start := func(ctx context.Context, spec string) context.CancelFunc {
		return h.plannerWith(ctx, Config{Spec: []byte(spec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Minute})
	}
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	stopA := start(ctx, testSpec)
	first := h.waitRevision(1)
	if !first.Valid() || first.Reason != "first plan" {
		t.Fatalf("revision 1: valid %v reason %q error %q", first.Valid(), first.Reason, first.Error)
	}

	// A used node dies: a new revision in which only its workers moved.
	victim := first.Workers.At(0).NodeID
	h.kill(victim)
	second := h.waitRevision(2)
	lost := map[string]bool{}
	for _, w := range first.Workers.Slice() {
		if w.NodeID == victim {
			lost[fmt.Sprint(w.Component, w.Index)] = true
		}
	}
	old := map[string]plan.Worker{}
	for _, w := range first.Workers.Slice() {
		old[fmt.Sprint(w.Component, w.Index)] = w
	}
	for _, w := range second.Workers.Slice() {
		k := fmt.Sprint(w.Component, w.Index)
		if o := old[k]; w.Component != plan.Buffer && !lost[k] && o.NodeID != w.NodeID {
			t.Errorf("%s moved from %s to %s", k, o.NodeID, w.NodeID)
		}
		if w.NodeID == victim {
			t.Errorf("%s still on dead %s", k, victim)
		}
	}
	if second.Moved == 0 {
		t.Errorf("revision 2 moved nobody: %s", second.Reason)
	}
	t.Logf("revision 2: %s", second.Reason)

	// The node comes back: nothing moves, nothing is published.
	done := h.waitPublished("default", 2)
	h.node(victim)
	h.waitReplans("default", done+1)
	if got := len(h.history()); got != 2 {
		t.Fatalf("%d revisions after the node came back, want 2", got)
	}

	// A restarted planner continues the sequence and republishes nothing.
	stopA()
	stopB := start(ctx, testSpec)
	defer stopB()
	regB := h.reg
	h.waitReplans("default", 1)
	if got := len(h.history()); got != 2 {
		t.Fatalf("%d revisions after restart, want 2", got)
	}

	// Two planners at once, and a spec change: one linear history.
	stopC := start(ctx, "")
	defer stopC()
	regC := h.reg
	revisionGauge := `poolplanner_plan_revision{plan="default"}`
	waitScraped(t, regC, "the second planner following revision 2", func(m map[string]float64) bool { return m[revisionGauge] == 2 })
	changed := testSpec + "\n# more train\n"
	changed = changed[:0] + `
scheduling:
  train:  {worker_num: 12, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 1, num_cpus: 1, num_gpus: 4}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`
	if _, err := store.NewSpecStore(h.js).Put(ctx, "default", []byte(changed)); err != nil {
		t.Fatal(err)
	}
	third := h.waitRevision(3)
	if third.Reason == "" || !third.Valid() {
		t.Fatalf("revision 3: valid %v reason %q", third.Valid(), third.Reason)
	}
	// The leader's replan done, the standby following: a second
	// revision 3 would be in the history.
	h.reg = regB
	h.waitPublished("default", 1)
	waitScraped(t, regC, "the second planner following revision 3", func(m map[string]float64) bool { return m[revisionGauge] == 3 })
	hist := h.history()
	for i, p := range hist {
		if p.Revision != i+1 {
			t.Fatalf("history revisions %v: not linear", revisions(hist))
		}
	}
	if len(hist) != 3 {
		t.Fatalf("history revisions %v, want 1..3", revisions(hist))
	}

	// The service answers lookups, validations and plans, and bad requests
	// with errors.
	var w client.PlacedWorker
	idx := 3
	if err := bus.Request(ctx, h.nc, client.LookupSubject, wire.LookupRequest{Plan: "default", Component: "train", Index: &idx}, &w); err != nil {
		t.Fatal(err)
	}
	if w.Index != 3 || w.CUDAVisibleDevices == "" || w.Revision != 3 {
		t.Errorf("lookup train 3: %+v", w)
	}
	var nw client.Assignment
	if err := bus.Request(ctx, h.nc, client.LookupSubject, wire.LookupRequest{Plan: "default", NodeID: w.NodeID}, &nw); err != nil || len(nw.Workers) == 0 {
		t.Errorf("lookup node %s: %v %+v", w.NodeID, err, nw)
	}
	var vr client.ValidateReply
	if err := bus.Request(ctx, h.nc, client.ValidateSubject, []byte(`{"scheduling": {"train": {"worker_num": 500, "num_cpus": 1, "num_gpus": 1}}, "placement": {"mode": "auto"}}`), &vr); err != nil {
		t.Fatal(err)
	}
	if vr.Valid() || vr.Error == "" || vr.Nodes != 4 {
		t.Errorf("validate 500 train: valid %v error %q nodes %d", vr.Valid(), vr.Error, vr.Nodes)
	}
	var p1 planner.Plan
	if err := bus.Request(ctx, h.nc, client.PlanSubject, wire.PlanRequest{Plan: "default", Revision: 1}, &p1); err != nil || p1.Revision != 1 {
		t.Errorf("plan revision 1: %v, got %d", err, p1.Revision)
	}
	bad := []struct {
		subject string
		req     any
		want    error
	}{
		{client.LookupSubject, []byte(`{not json`), client.ErrBadRequest},
		{client.LookupSubject, wire.LookupRequest{Plan: "default"}, client.ErrBadRequest},
		{client.LookupSubject, wire.LookupRequest{Plan: "default", Component: "train", Index: new(99)}, client.ErrNotFound},
		{client.PlanSubject, wire.PlanRequest{Plan: "default", Revision: 99}, client.ErrNotFound},
		{client.PlanSubject, wire.PlanRequest{Plan: "no.such"}, client.ErrBadRequest},
		{client.ValidateSubject, []byte(`{"scheduling": 3}`), client.ErrBadRequest},
		{client.ValidateSubject, []byte(``), client.ErrBadRequest},
	}
	for _, b := range bad {
		var out json.RawMessage
		err := bus.Request(ctx, h.nc, b.subject, b.req, &out)
		if !errors.Is(err, b.want) {
			t.Errorf("%s %v: err %v, want %v", b.subject, b.req, err, b.want)
		}
	}
}

func revisions(ps []*planner.Plan) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.Revision
	}
	return out
}

// TestRestartSettles: a planner restarted while a node of the valid plan
// has not reported yet waits for it, instead of replanning without it.
func TestRestartSettles(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	stopA := h.planner(ctx, testSpec)
	first := h.waitRevision(1)
	stopA()

	// The node's key expires while no planner runs.
	victim := first.Workers.At(0).NodeID
	h.kill(victim)
	kv := h.inventory()
	natstest.WaitFor(t, 5*time.Second, victim+" expired", func() bool {
		_, err := kv.Get(ctx, victim)
		return err != nil
	})
	stopB := h.plannerWith(ctx, Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: time.Minute, guardRound: quickGuard})
	defer stopB()
	// The restarted planner leads and holds the inventory without the
	// victim (its inventory gauge, set every guard round).
	waitScraped(t, h.reg, "the restarted planner leading on 2 nodes", func(m map[string]float64) bool {
		return m[`poolplanner_plan_leader{plan="default"}`] == 1 && m["poolplanner_inventory_nodes"] == 2
	})
	h.node(victim) // back within the settle period
	// Its nodes all back, it replans at once, well within the minute.
	h.waitReplans("default", 1)
	if got := h.history(); len(got) != 1 {
		t.Fatalf("%d revisions, want 1 (revision 2: %s)", len(got), got[len(got)-1].Reason)
	}
}

// TestSettleOnlyForSilentNodes: settling waits only for nodes of a plan
// found at start that have not reported since. A node leaving right
// after a fresh start (its plan made by this planner), or after a restart
// once it had reported, is replanned at once, however long --settle is.
func TestSettleOnlyForSilentNodes(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: time.Hour}
	stopA := h.plannerWith(ctx, cfg)
	first := h.waitRevision(1)
	h.kill(first.Workers.At(0).NodeID)
	second := h.waitRevision(2) // within waitRevision's 10 s, not the hour
	stopA()

	stopB := h.plannerWith(ctx, cfg)
	defer stopB()
	waitScraped(t, h.reg, "the restarted planner leading", func(m map[string]float64) bool {
		return m[`poolplanner_plan_leader{plan="default"}`] == 1
	})
	h.heartbeats() // every live node reports to it
	h.kill(second.Workers.At(0).NodeID)
	if third := h.waitRevision(3); third.Moved == 0 {
		t.Errorf("revision 3 moved nothing: %s", third.Reason)
	}
}

// simDoc is the inventory document of a node of 8 simulated H100s, the
// listed GPUs unhealthy.
func simDoc(id string, sick ...int) []byte {
	sim, _ := inventory.ParseSimulation("8xH100")
	inv := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}.Inventory()
	inv.GPUs = inventory.SimulatedGPUs(id, sim)
	for _, g := range sick {
		inv.GPUs[g].Healthy = false
	}
	doc, _ := json.Marshal(inv)
	return doc
}

// inventory is the inventory bucket, to read keys from.
func (h *harness) inventory() kvGetter {
	h.t.Helper()
	if h.mem != nil {
		return memInvGetter{h.mem}
	}
	kv, err := store.NewInventoryStore(h.js).KV(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return kv
}

// plans is the plan store the harness's planners publish to, as a
// reader.
func (h *harness) plans() planStore {
	if h.mem != nil {
		return h.mem.plans("")
	}
	return jsPlans{store.NewPlanStore(h.js)}
}

// kvGetter reads a key's newest record, as jetstream.KeyValue does.
type kvGetter interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
}

// memInvGetter is memJS's inventory bucket as a kvGetter.
type memInvGetter struct{ m *memJS }

func (g memInvGetter) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	kv := g.m.inv
	kv.js.mu.Lock()
	defer kv.js.mu.Unlock()
	if e, ok := kv.current(key); ok && e.op == jetstream.KeyValuePut {
		return e, nil
	}
	return nil, jetstream.ErrKeyNotFound
}

// url is the harness's server's ("" on memJS, where instances need
// none).
func (h *harness) url() string {
	if h.mem != nil {
		return ""
	}
	return h.nc.ConnectedUrl()
}
