package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// bigSpec has more workers than the tests' InlineWorkers, so events are
// changes and snapshots.
const bigSpec = `
scheduling:
  train:  {worker_num: 8, num_cpus: 1, num_gpus: 1}
  env:
    - {worker_num: 40, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// offline is a planner driven by hand (no loop): inventory put straight
// into its view, replans called directly.
func offline(t *testing.T, h *harness, nodes int) *loopState {
	t.Helper()
	p := drive(New(Config{NC: h.nc, JS: h.js, SnapshotEvery: 4, InlineWorkers: 10, Settle: -1, Log: zerolog.Nop()}))
	if h.mem != nil {
		h.mem.onMem(p.Service)
	}
	latest, err := p.start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p.own().latest, p.own().reconcile = latest, latest != nil
	spec, _ := planner.ParseSpec([]byte(bigSpec))
	p.own().spec, p.own().digest = spec, SpecDigest(spec)
	for i := range nodes {
		id := fmt.Sprintf("n%02d", i)
		var doc inventory.NodeInventory
		_ = json.Unmarshal(simDoc(id), &doc)
		_, _ = p.live.put(id, doc)
	}
	return p
}

// TestMissingSnapshot: the latest revision's snapshot is gone (deleted
// by hand). The plan still exists: the planner reads it as unreadable
// and publishes the next revision whole, rather than taking the plan for
// new and failing to publish revision 1 for ever.
func TestMissingSnapshot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := offline(t, h, 4)
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := wireClient(p).Plan(ctx, "default", 1)
	if err != nil || r.Event.Snapshot == "" {
		t.Fatalf("revision 1: %v, a %s event", err, r.Event.Kind())
	}
	p.plans.DropSnapshot(ctx, r.Event.Snapshot)
	if _, err := wireClient(p).Plan(ctx, "default", 0); !errors.Is(err, client.ErrUnreadable) {
		t.Fatalf("latest without its snapshot: %v, want unreadable", err)
	}
	q := offline(t, h, 4)
	if !q.own().latest.Unreadable {
		t.Fatalf("the restarted planner's latest: %+v", q.own().latest)
	}
	if err := q.replan(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := wireClient(q).Plan(ctx, "default", 0); err != nil || r.Document.Revision != 2 || !r.Document.Valid() {
		t.Fatalf("revision 2: %v", err)
	}
}

// TestHostileEvents: events that break the scheme (a base after the
// revision, a change on a base that is not whole, worker_counts out of
// range) are unreadable revisions, never a wrong document or a panic.
func TestHostileEvents(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := offline(t, h, 4)
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	c := wireClient(p)
	for i, body := range []string{
		`{"name":"default","revision":2,"base":5,"change":{"nodes":[],"pools":[],"export":{"node_ids":[],"worker_counts":[0,0,0]}}}`,
		`{"name":"default","revision":3,"base":2,"change":{"nodes":[],"pools":[],"export":{"node_ids":[],"worker_counts":[0,0,0]}}}`,
		`{"name":"default","revision":4,"base":1,"change":{"nodes":[],"pools":[],"export":{"node_ids":[],"worker_counts":[-1,0,0]}}}`,
		`{"name":"default","revision":5,"base":5}`,
		`{"name":"default","revision":6,"base":6,"snapshot":"other/snapshots/6/x"}`,
		`{"name":"other","revision":7,"base":7,"resource_pool":[],"pools":[],"workers":[],"storage_to_train_workers":{}}`,
		`{"name":"default","revision":8,"base":8,"resource_pool":[],"pools":[],"workers":[],"storage_to_train_workers":{}}`,
		// A chain from revision 1 through the whole revision 8: broken.
		`{"name":"default","revision":9,"base":1,"change":{"nodes":[],"pools":[],"export":{"node_ids":[],"worker_counts":[0,0,0]}}}`,
	} {
		msg := nats.NewMsg(client.PlanEventSubject("default"))
		msg.Header.Set(client.RevisionHeader, fmt.Sprint(i+2))
		msg.Data = []byte(body)
		if _, err := h.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		_, err := c.Plan(ctx, "default", i+2)
		if i+2 == 8 {
			if err != nil {
				t.Errorf("revision 8, whole: %v", err)
			}
			continue
		}
		if !errors.Is(err, client.ErrUnreadable) {
			t.Errorf("revision %d (%s): %v, want unreadable", i+2, body, err)
		}
	}
}

// TestAnotherPlannersAssignments: another planner stored a revision and
// died before its assignments. The running planner adopts the revision
// and, a moment later, publishes the assignments of the nodes it changed.
func TestAnotherPlannersAssignments(t *testing.T) {
	t.Parallel()
	// The assignments are checked checkAfter after the adoption: the
	// clock hurries there (the nodes' keys and the loop's pulse outlast
	// it).
	clock := &skewClock{}
	h := newMemHarnessOn(t, clock)
	h.ttl = time.Minute
	ctx := context.Background()
	for i := range 4 {
		h.node(fmt.Sprintf("n%02d", i))
	}
	stop := h.plannerWith(ctx, Config{Spec: []byte(bigSpec), Debounce: 50 * time.Millisecond, Settle: -1, InlineWorkers: 10, StallAfter: time.Minute})
	defer stop()
	first := h.waitRevision(1)

	// The other planner sees one node fewer and publishes only the event.
	b := offline(t, h, 4)
	victim := first.Workers.At(0).NodeID
	b.live.remove(victim)
	next, _, _ := planner.Replan(b.own().latest.Plan, b.own().spec, b.live.planNodes())
	next.Name, next.Revision, next.CreatedAt, next.Reason = "default", 2, time.Now().UTC(), "test: the other planner"
	ev, _, err := b.event(ctx, b.own().latest, next, planner.Diff(b.own().latest.Plan, next))
	if err != nil || ev.Change == nil {
		t.Fatalf("event: %v", err)
	}
	if _, err := b.plans.PublishEvent(ctx, ev, b.own().digest, b.own().latest.Seq, 0); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the node that left without its assignment", clock.hurrying(100*time.Millisecond, func() bool {
		a, err := b.plans.Assignment(ctx, "default", victim)
		return err == nil && a.Revision == 2 && len(a.Workers) == 0
	}))
	checkAssignments(t, b.plans, next)
}

// TestRepairsKeepNewer: a repair never replaces an assignment of a newer
// revision than the planner's (another planner's), and a damaged message
// on a node of another planner's revision is repaired.
func TestRepairsKeepNewer(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := offline(t, h, 4)
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	ws := p.own().latest.Plan.Workers.Slice()
	newer, damaged := ws[0].NodeID, ws[len(ws)-1].NodeID
	if newer == damaged {
		t.Fatal("want workers on two nodes")
	}
	c := wireClient(p)
	ahead := client.Assignment{Plan: "default", Revision: 9, NodeID: newer, Workers: []client.PlacedWorker{}}
	if _, err := p.plans.PublishAssignments(ctx, []client.Assignment{ahead}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.Publish(ctx, client.AssignmentSubject("default", damaged), []byte("{")); err != nil {
		t.Fatal(err)
	}
	p.own().verify = map[string]bool{newer: true, damaged: true}
	if err := p.checkAssignments(ctx, p.own()); err != nil {
		t.Fatal(err)
	}
	if a, err := c.Assignment(ctx, "default", newer); err != nil || a.Revision != 9 {
		t.Errorf("the newer assignment was replaced: %+v %v", a, err)
	}
	if a, err := c.Assignment(ctx, "default", damaged); err != nil || a.Revision != 1 || len(a.Workers) == 0 {
		t.Errorf("the damaged assignment: %+v %v", a, err)
	}
}

// TestRestartKeepsAssignments: a planner that starts on an unreadable
// latest does not empty every node's assignment while it replans; and a
// damaged assignment message (on a node of the plan, or on no node's)
// does not stop it: it replaces them.
func TestRestartKeepsAssignments(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := offline(t, h, 4)
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	node := p.own().latest.Plan.Workers.At(0).NodeID
	for _, subject := range []string{client.AssignmentSubject("default", node), client.AssignmentSubject("default", "bogus")} {
		if _, err := h.js.Publish(ctx, subject, []byte("{")); err != nil {
			t.Fatal(err)
		}
	}
	msg := nats.NewMsg(client.PlanEventSubject("default"))
	msg.Header.Set(client.RevisionHeader, "2")
	msg.Data = []byte(`{"revision": 2, "cpus_required": +Inf`)
	if _, err := h.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	sub, err := h.nc.SubscribeSync(client.AssignmentSubjectPrefix + "default.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = h.nc.Flush()

	q := offline(t, h, 4)
	if err := q.replan(ctx); err != nil {
		t.Fatal(err)
	}
	if q.own().latest.Plan.Revision != 3 || !q.own().latest.Plan.Valid() {
		t.Fatalf("revision %d: %s", q.own().latest.Plan.Revision, q.own().latest.Plan.Error)
	}
	checkAssignments(t, wireClient(q), q.own().latest.Plan)
	// Every assignment was stored (acknowledged) before replan returned,
	// so sent to the subscription before the flush's reply: all are
	// pending on it now.
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var emptied []string
	for {
		n, _, err := sub.Pending()
		if err != nil || n == 0 {
			break
		}
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var a client.Assignment
		if json.Unmarshal(m.Data, &a) == nil && len(a.Workers) == 0 {
			emptied = append(emptied, m.Subject)
		}
	}
	if len(emptied) != 1 || emptied[0] != client.AssignmentSubject("default", "bogus") {
		t.Errorf("emptied %v; want only the damaged message of no node", emptied)
	}
}

// syncBuffer is a log sink tests can read while the planner writes.
type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

// TestHostileInventory: documents that cannot be trusted, put under keys
// of their own, are each ignored and counted once under the kind of
// fault (poolplanner_inventory_rejected_total), and the plan of the
// other nodes does not change.
func TestHostileInventory(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	reg := prometheus.NewRegistry()
	p := New(Config{NC: h.nc, JS: h.js, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, Log: zerolog.Nop(),
		Metrics: metrics.NewPlanner(reg)})
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(pctx) }()
	defer func() { cancel(); <-done }()
	first := h.waitRevision(1)

	good := func(id string) inventory.NodeInventory {
		var doc inventory.NodeInventory
		_ = json.Unmarshal(simDoc(id), &doc)
		return doc
	}
	mk := func(edit func(*inventory.NodeInventory)) []byte {
		doc := good("evil")
		edit(&doc)
		b, _ := json.Marshal(doc)
		return b
	}
	invs := store.NewInventoryStore(h.js)
	rejected := func(reason string) string {
		return fmt.Sprintf("poolplanner_inventory_rejected_total{reason=%q}", reason)
	}
	for _, c := range []struct {
		name, reason string
		doc          []byte
	}{
		{"another node's id", "key_mismatch", mk(func(d *inventory.NodeInventory) { d.NodeID = "n1" })},
		{"no id", "invalid", mk(func(d *inventory.NodeInventory) { d.NodeID = "" })},
		{"negative CPUs", "invalid", mk(func(d *inventory.NodeInventory) { d.CPUs = -100 })},
		{"65 GPUs", "invalid", mk(func(d *inventory.NodeInventory) {
			for i := len(d.GPUs); i < 65; i++ {
				d.GPUs = append(d.GPUs, inventory.GPU{Index: i, UUID: fmt.Sprintf("GPU-x-%d", i), Healthy: true})
			}
		})},
		{"a long string", "invalid", mk(func(d *inventory.NodeInventory) { d.Hostname = strings.Repeat("h", 2048) })},
		{"duplicate UUIDs", "invalid", mk(func(d *inventory.NodeInventory) { d.GPUs[1].UUID = d.GPUs[0].UUID })},
		{"not JSON", "unparsable", []byte(`{"node_id": "evil", "gpus": [`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := scraped(t, reg)
			if _, err := invs.Put(ctx, "evil", c.doc, false, time.Minute); err != nil {
				t.Fatal(err)
			}
			// One rejection, of this kind, and of no other.
			after := waitScraped(t, reg, "the rejection counted", func(m map[string]float64) bool {
				return m[rejected(c.reason)] > before[rejected(c.reason)]
			})
			for _, r := range []string{"unparsable", "invalid", "key_mismatch"} {
				want := before[rejected(r)]
				if r == c.reason {
					want++
				}
				if got := after[rejected(r)]; got != want {
					t.Errorf("%s = %v, want %v", rejected(r), got, want)
				}
			}
			// A rejected document should start no replan; were one
			// started, the loop would be idle only once it published.
			ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
			defer icancel()
			if err := p.Idle(ictx); err != nil {
				t.Fatalf("the planner not idle: %v", err)
			}
			if got := len(h.history()); got != 1 {
				t.Fatalf("%d revisions; the hostile document changed the plan", got)
			}
		})
	}
	if got := h.waitRevision(1); got.Workers.Len() != first.Workers.Len() {
		t.Errorf("workers %d, were %d", got.Workers.Len(), first.Workers.Len())
	}
}

// TestRejectedOncePerReason: a refused key is counted (and logged) once
// per reason while it holds that document, though a watch made again
// delivers it again; a new reason, or the key accepted or gone and then
// refused again, is news.
func TestRejectedOncePerReason(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := drive(New(Config{Metrics: metrics.NewPlanner(reg), Log: zerolog.Nop()}))
	const series = `poolplanner_inventory_rejected_total{reason="invalid"}`
	refuse := func(why string) store.Event {
		return store.Event{Op: store.Rejected, NodeID: "evil", Reason: why, Rejection: store.RejectInvalid}
	}
	for _, step := range []struct {
		ev   store.Event
		want float64
	}{
		{refuse("negative cpus"), 1},
		{refuse("negative cpus"), 1}, // a watch made again delivers it again
		{refuse("65 GPUs"), 2},
		{store.Event{Op: store.Removed, NodeID: "evil"}, 2},
		{refuse("65 GPUs"), 3},
	} {
		p.apply(step.ev)
		if got := scraped(t, reg)[series]; got != step.want {
			t.Fatalf("after %v %q: %s = %v, want %v", step.ev.Op, step.ev.Reason, series, got, step.want)
		}
	}
}
