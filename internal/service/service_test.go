package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
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
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream
	// beats keeps simulated nodes alive; cancel one to let it expire.
	mu    sync.Mutex
	beats map[string]context.CancelFunc
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, bus.EmbeddedOptions{})
}

// newHarnessWith starts the harness's server with opts (its store in a
// temp dir).
func newHarnessWith(t *testing.T, opts bus.EmbeddedOptions) *harness {
	t.Helper()
	nc := connect(t, startServer(t, opts))
	js, _ := jetstream.New(nc)
	h := &harness{t: t, nc: nc, js: js, beats: map[string]context.CancelFunc{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.beats {
			c()
		}
	})
	return h
}

// startServer starts an embedded server (its store in a temp dir) for
// the test, and returns its URL.
func startServer(tb testing.TB, opts bus.EmbeddedOptions) string {
	tb.Helper()
	opts.StoreDir = tb.TempDir()
	ns, url, err := bus.StartEmbedded(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return url
}

// connect connects to url for the test.
func connect(tb testing.TB, url string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// node starts a simulated reporter for id: 8 H100s, a 1s TTL, a
// heartbeat every 300ms.
func (h *harness) node(id string) {
	h.t.Helper()
	doc := simDoc(id)
	invs := store.NewInventoryStore(h.js)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := invs.Put(ctx, id, doc, false, time.Second); err != nil {
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
				_, _ = invs.Put(ctx, id, doc, true, time.Second)
			}
		}
	}()
}

// kill stops id's heartbeats without deleting its key: it expires.
func (h *harness) kill(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beats[id]()
}

func (h *harness) planner(ctx context.Context, spec string) context.CancelFunc {
	return h.plannerWith(ctx, Config{Spec: []byte(spec), Debounce: 50 * time.Millisecond, Settle: -1})
}

func (h *harness) plannerWith(ctx context.Context, cfg Config) context.CancelFunc {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	cfg.NC, cfg.JS, cfg.Log = h.nc, h.js, zerolog.Nop()
	p := New(cfg)
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
	plans := store.NewPlanStore(h.js)
	var revs []int
	err := plans.Client().History(context.Background(), "default", func(i client.Info) bool {
		revs = append(revs, i.Revision)
		return true
	})
	if err != nil {
		h.t.Fatal(err)
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

// waitRevision waits for revision rev of the default plan.
func (h *harness) waitRevision(rev int) *planner.Plan {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		sp, err := store.NewPlanStore(h.js).Latest(context.Background(), "default")
		if err == nil && sp != nil && sp.Plan.Revision >= rev {
			if sp.Plan.Revision != rev {
				h.t.Fatalf("revision %d, want %d", sp.Plan.Revision, rev)
			}
			return sp.Plan
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("no revision %d", rev)
	return nil
}

func TestServiceEndToEnd(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	stopA := h.planner(ctx, testSpec)
	first := h.waitRevision(1)
	if !first.Valid || first.Reason != "first plan" {
		t.Fatalf("revision 1: valid %v reason %q error %q", first.Valid, first.Reason, first.Error)
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
	h.node(victim)
	time.Sleep(500 * time.Millisecond)
	if got := len(h.history()); got != 2 {
		t.Fatalf("%d revisions after the node came back, want 2", got)
	}

	// A restarted planner continues the sequence and republishes nothing.
	stopA()
	stopB := h.planner(ctx, testSpec)
	defer stopB()
	time.Sleep(500 * time.Millisecond)
	if got := len(h.history()); got != 2 {
		t.Fatalf("%d revisions after restart, want 2", got)
	}

	// Two planners at once, and a spec change: one linear history.
	stopC := h.planner(ctx, "")
	defer stopC()
	time.Sleep(200 * time.Millisecond)
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
	if third.Reason == "" || !third.Valid {
		t.Fatalf("revision 3: valid %v reason %q", third.Valid, third.Reason)
	}
	time.Sleep(300 * time.Millisecond)
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
	if vr.Valid || vr.Error == "" || vr.Nodes != 4 {
		t.Errorf("validate 500 train: valid %v error %q nodes %d", vr.Valid, vr.Error, vr.Nodes)
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
	h := newHarness(t)
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
	kv, err := store.NewInventoryStore(h.js).KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := kv.Get(ctx, victim); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not expire", victim)
		}
	}
	stopB := h.plannerWith(ctx, Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 3 * time.Second})
	defer stopB()
	time.Sleep(time.Second)
	h.node(victim) // back within the settle period
	time.Sleep(3 * time.Second)
	if got := h.history(); len(got) != 1 {
		t.Fatalf("%d revisions, want 1 (revision 2: %s)", len(got), got[len(got)-1].Reason)
	}
}

// TestSettleOnlyForSilentNodes: settling waits only for nodes of a plan
// found at start that have not reported since. A node leaving right
// after a fresh start (its plan made by this planner), or after a restart
// once it had reported, is replanned at once, however long --settle is.
func TestSettleOnlyForSilentNodes(t *testing.T) {
	h := newHarness(t)
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
	time.Sleep(500 * time.Millisecond) // every live node heartbeats meanwhile
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
