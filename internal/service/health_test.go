package service

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// healthDoc is node id's 8 simulated GPUs with GPU 3 healthy or not.
func healthDoc(t *testing.T, id string, healthy bool) inventory.NodeInventory {
	t.Helper()
	var sick []int
	if !healthy {
		sick = []int{3}
	}
	var doc inventory.NodeInventory
	if err := json.Unmarshal(simDoc(id, sick...), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestProbationAndFlapping, on the service's clock: a GPU that turns
// healthy again stays out for the probation, then gets work; one that
// turned unhealthy FlapCount times within FlapWindow is held out (a
// drain of cause flapping) past any probation, until it is undrained;
// turns spread over more than the window hold nothing out.
func TestProbationAndFlapping(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{Clock: c, Probation: 10 * time.Minute, Log: zerolog.Nop()}))
	p.drainsRead(map[string]store.Drain{})
	report := func(healthy bool) {
		t.Helper()
		p.apply(store.Event{Op: store.Changed, NodeID: "n1", Inventory: healthDoc(t, "n1", healthy)})
		p.refreshOut()
	}
	tick := func(d time.Duration) {
		c.advance(d)
		select {
		case <-p.drain.timer.C():
			p.drain.at = time.Time{}
		default:
		}
		p.refreshOut()
	}
	drained := func() []int { return p.live.nodes["n1"].Drained }
	causes := func() []string {
		var out []string
		for _, d := range p.drainViews() {
			out = append(out, d.Cause)
		}
		return out
	}
	steps := []struct {
		what    string
		do      func()
		drained []int
		causes  []string
	}{
		{"healthy at first", func() { report(true) }, nil, nil},
		{"unhealthy (1)", func() { report(false) }, nil, nil},
		{"healthy again: on probation", func() { report(true) }, []int{3}, []string{plan.DrainProbation}},
		{"probation nearly over", func() { tick(9 * time.Minute) }, []int{3}, []string{plan.DrainProbation}},
		{"probation over", func() { tick(time.Minute) }, nil, nil},
		{"unhealthy (2)", func() { report(false) }, nil, nil},
		{"healthy again", func() { tick(time.Minute); report(true) }, []int{3}, []string{plan.DrainProbation}},
		{"unhealthy (3) within the hour: held out", func() { report(false) }, []int{3}, []string{plan.DrainFlapping}},
		{"healthy again: still held out", func() { report(true) }, []int{3}, []string{plan.DrainFlapping}},
		{"hours later: still held out", func() { tick(5 * time.Hour) }, []int{3}, []string{plan.DrainFlapping}},
		{"stored (the watch brings it), then undrained", func() {
			p.drainsRead(maps.Clone(p.drain.byKey))
			p.drainsRead(map[string]store.Drain{})
		}, nil, nil},
		{"unhealthy again after the undrain (1)", func() { report(false) }, nil, nil},
		{"over more than the window", func() {
			for range 3 {
				tick(31 * time.Minute)
				report(true)
				tick(31 * time.Minute)
				report(false)
			}
			report(true)
			tick(11 * time.Minute)
		}, nil, nil},
	}
	for _, s := range steps {
		s.do()
		if got := drained(); !slices.Equal(got, s.drained) {
			t.Errorf("%s: drained GPUs %v, want %v", s.what, got, s.drained)
		}
		if got := causes(); !slices.Equal(got, s.causes) {
			t.Errorf("%s: out for %v, want %v", s.what, got, s.causes)
		}
	}
	if got := p.drain.byKey[store.DrainKey("n1", new(3))]; got.Cause != "" {
		t.Errorf("after the undrain the hold-out stays: %+v", got)
	}
}

// TestXIDEndToEnd: a simulated reporter's GPU throws an XID a reset
// resolves (as reporter --simulate 8xH100 --xid GPU:94 does): the
// planner moves its worker off; the reporter's next health check finds
// the GPU clean and reports it healthy; the planner keeps it out for
// the probation, then puts it back into placement, moving nobody.
func TestXIDEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, id := range []string{"n2", "n3", "n4"} {
		h.node(id)
	}
	sim, _ := inventory.ParseSimulation("8xH100")
	src := inventory.NewSimulated(inventory.Facts{NodeID: "n1", Hostname: "n1", IP: "10.0.0.1", CPUs: 64}, sim)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = reporter.Run(ctx, reporter.Config{Source: src, Store: store.NewInventoryStore(h.js), Heartbeat: 300 * time.Millisecond, TTL: 2 * time.Second, Log: zerolog.Nop()})
	}()
	stop := h.plannerWith(context.Background(), Config{Spec: []byte(drainSpec), Debounce: 50 * time.Millisecond, Settle: -1, Probation: 2 * time.Second})
	defer stop()
	first := h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	var w *plan.Worker
	for _, x := range first.Workers.All() {
		if x.NodeID == "n1" && len(x.GPUs) == 1 {
			w = x
			break
		}
	}
	if w == nil {
		t.Fatal("no one-GPU worker on n1")
	}
	gpu := w.GPUs[0]
	go src.RunXIDs(ctx, []inventory.XIDInjection{{GPU: gpu, Code: 94}}, time.Second)
	moved := h.waitFor("default", "the worker off the GPU that threw the XID", func(p *planner.Plan) bool {
		x := p.Workers.Find(w.Component, w.Index)
		return x != nil && place(*x) != place(*w)
	})
	if !moved.Valid() || !strings.Contains(moved.Reason, fmt.Sprintf("GPU unhealthy n1:%d", gpu)) {
		t.Errorf("after the XID: valid %v, reason %q", moved.Valid(), moved.Reason)
	}
	// The reporter finds it clean; the planner holds it out meanwhile.
	kv, err := store.NewInventoryStore(h.js).KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the GPU reported healthy again", func() bool {
		e, err := kv.Get(ctx, "n1")
		var doc inventory.NodeInventory
		return err == nil && json.Unmarshal(e.Value(), &doc) == nil && doc.GPUs[gpu].Healthy
	})
	waitScraped(t, h.reg, "the recovered GPU on probation", func(m map[string]float64) bool {
		return m[`poolplanner_drained_gpus{cause="probation"}`] == 1
	})
	if sp, _ := store.NewPlanStore(h.js).Latest(ctx, "default"); sp == nil || onNodeGPU(sp.Plan, "n1", gpu) {
		t.Errorf("a worker placed on the GPU on probation")
	}
	waitScraped(t, h.reg, "the probation over", func(m map[string]float64) bool {
		return m[`poolplanner_drained_gpus{cause="probation"}`] == 0
	})
	// The loop cleared the gauge in the step that kicks the replan
	// putting the GPU back (or in that replan): once the loop is idle,
	// that replan is done. (Counting replans from here missed it when it
	// was done before the count was read: no other followed.)
	ictx, icancel := context.WithTimeout(ctx, 30*time.Second)
	defer icancel()
	if err := h.newest.Idle(ictx); err != nil {
		t.Fatalf("the planner not idle after the probation: %v", err)
	}
	// Revisions since say the GPU is healthy again (the pools' unhealthy
	// GPUs); none moves a worker.
	for _, p := range h.history()[moved.Revision:] {
		if p.Moved != 0 {
			t.Errorf("revision %d moved %d: %s", p.Revision, p.Moved, p.Reason)
		}
		checkOnlyMoved(t, moved, p, nil)
	}
}

// onNodeGPU reports whether a worker of p uses GPU gpu of node.
func onNodeGPU(p *planner.Plan, node string, gpu int) bool {
	for _, w := range p.Workers.All() {
		if w.NodeID == node && slices.Contains(w.GPUs, gpu) {
			return true
		}
	}
	return false
}

// TestNodeFlapping: a node whose key runs out FlapCount times within
// FlapWindow is held out whole when it comes back, until undrained; a
// reporter that shuts down (deleting its key) counts nothing, nor do
// expiries spread over more than the window.
func TestNodeFlapping(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{Clock: c, Log: zerolog.Nop()}))
	p.drainsRead(map[string]store.Drain{})
	// The loop reads the drain timer; here the test does, lest a fired
	// timer's channel block the clock.
	advance := func(d time.Duration) {
		c.advance(d)
		select {
		case <-p.drain.timer.C():
			p.drain.at = time.Time{}
		default:
		}
	}
	for _, id := range []string{"n2", "n3", "n4"} {
		p.apply(store.Event{Op: store.Changed, NodeID: id, Inventory: healthDoc(t, id, true)})
	}
	cycle := func(why string, after time.Duration) {
		p.apply(store.Event{Op: store.Changed, NodeID: "n1", Inventory: healthDoc(t, "n1", true)})
		advance(after)
		p.apply(store.Event{Op: store.Removed, NodeID: "n1", Reason: why})
		p.apply(store.Event{Op: store.Changed, NodeID: "n1", Inventory: healthDoc(t, "n1", true)})
		p.refreshOut()
		advance(burstWindow) // counted once it is clear no outage took it
		p.refreshOut()
	}
	out := func() bool { return p.live.nodes["n1"].Out }
	for range 5 {
		cycle(store.ReasonDeleted, time.Minute)
	}
	if out() {
		t.Fatal("held out after clean shutdowns")
	}
	for range 4 {
		cycle(store.ReasonExpired, 31*time.Minute)
	}
	if out() {
		t.Fatal("held out for expiries more than an hour apart")
	}
	for range 3 {
		cycle(store.ReasonExpired, time.Minute)
	}
	if !out() {
		t.Fatal("not held out after 3 expiries within the hour")
	}
	if ds := p.drainViews(); len(ds) != 1 || ds[0].Target() != "n1" || ds[0].Cause != plan.DrainFlapping {
		t.Fatalf("drains %+v, want n1 held out for flapping", ds)
	}
	p.drainsRead(maps.Clone(p.drain.byKey)) // the leader stored it
	p.drainsRead(map[string]store.Drain{})  // planner undrain n1
	if out() {
		t.Fatal("still out after the undrain")
	}
	cycle(store.ReasonExpired, time.Minute)
	if out() {
		t.Fatal("held out at the first expiry after the undrain")
	}

	// An outage: every node's key runs out at once, three times in an
	// hour: nobody is held out.
	p.drainsRead(map[string]store.Drain{})
	for range 3 {
		advance(5 * time.Minute)
		for _, id := range []string{"n1", "n2", "n3", "n4"} {
			p.apply(store.Event{Op: store.Removed, NodeID: id, Reason: store.ReasonExpired})
		}
		for _, id := range []string{"n1", "n2", "n3", "n4"} {
			p.apply(store.Event{Op: store.Changed, NodeID: id, Inventory: healthDoc(t, id, true)})
		}
		advance(burstWindow)
		p.refreshOut()
	}
	if ds := p.drainViews(); len(ds) != 0 {
		t.Errorf("held out after outages: %+v", ds)
	}
}

// TestHoldOutUnstored, on the service's clock: a hold-out the leader
// cannot store (the drain bucket gone) stays in force, with its GPU's
// flap history, through changes of the bucket's other drains; the
// leader stores it once it can (the guard's retry after its backoff,
// or at once on taking the lease), not before the backoff, and without
// making the bucket itself; once the watch brings it, an undrain ends
// it.
func TestHoldOutUnstored(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := drive(New(Config{Clock: c, NC: h.nc, JS: h.js, Probation: -1, Log: zerolog.Nop()}))
	p.fence.set(5, 1)
	p.led.Store(1) // the leader
	p.drainsRead(map[string]store.Drain{})
	report := func(healthy bool) {
		p.apply(store.Event{Op: store.Changed, NodeID: "n1", Inventory: healthDoc(t, "n1", healthy)})
		p.refreshOut()
	}
	report(true)
	for range FlapCount {
		report(false)
		report(true)
	}
	key := store.DrainKey("n1", new(3))
	held := func(what string) {
		t.Helper()
		if got := p.live.nodes["n1"].Drained; !slices.Equal(got, []int{3}) {
			t.Errorf("%s: drained GPUs %v, want [3]", what, got)
		}
		if dr, ok := p.drain.byKey[key]; !ok || dr.Cause != plan.DrainFlapping {
			t.Errorf("%s: the hold-out is not in force: %+v", what, p.drain.byKey)
		}
		if hl := p.drain.health[healthKey("n1", 3)]; hl == nil || !hl.held {
			t.Errorf("%s: the GPU's flap history is gone", what)
		}
	}
	held("held out, no bucket to store it in")
	operator := store.Drain{NodeID: "n2", Cause: plan.DrainOperator, By: "test@host", At: c.Now()}
	p.drainsRead(map[string]store.Drain{operator.Key(): operator}) // n2 drained
	held("after another drain")
	p.drainsRead(map[string]store.Drain{}) // n2 undrained
	held("after another undrain")
	if _, err := h.js.Stream(ctx, "KV_"+client.DrainBucket); err == nil {
		t.Fatal("the hold-out's Put made the drain bucket")
	}

	ds := store.NewDrainStore(h.js)
	if _, err := ds.Ensure(ctx); err != nil { // the guard's restore
		t.Fatal(err)
	}
	stored := func() bool {
		got, _, err := ds.List(ctx)
		return err == nil && len(got) == 1 && got[0].Key() == key && got[0].Cause == plan.DrainFlapping
	}
	p.storeHoldOuts(ctx, false)
	if stored() {
		t.Fatal("retried before its backoff")
	}
	c.advance(2 * bus.BackoffMax) // past any jittered backoff
	p.storeHoldOuts(ctx, false)
	if !stored() {
		t.Fatal("not stored once the bucket is back")
	}
	p.drainsRead(map[string]store.Drain{}) // a change from before the Put
	held("stored, not yet seen by the watch")

	// Taking the lease stores at once what a standby held out.
	if err := h.js.DeleteKeyValue(ctx, client.DrainBucket); err != nil {
		t.Fatal(err)
	}
	p.drain.unstored[key].stored = false
	p.drain.tries, p.drain.retryAt = 3, c.Now().Add(time.Hour)
	if _, err := ds.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	p.storeHoldOuts(ctx, true)
	if !stored() {
		t.Fatal("not stored at once on taking the lease")
	}

	p.drainsRead(map[string]store.Drain{key: p.drain.byKey[key]}) // the watch brings it
	if len(p.drain.unstored) != 0 {
		t.Errorf("still unstored once the watch brought it: %v", p.drain.unstored)
	}
	p.drainsRead(map[string]store.Drain{}) // planner undrain n1:3
	if got := p.live.nodes["n1"].Drained; len(got) != 0 || p.drain.health[healthKey("n1", 3)] != nil {
		t.Errorf("after the undrain: drained %v, health %+v", got, p.drain.health[healthKey("n1", 3)])
	}
}

// TestHealthOf: a node's GPU health as last seen is found by UUID in the
// list the report had, the last entry where a list names a UUID twice
// (as a map filled in order kept it), none for a UUID not listed.
func TestHealthOf(t *testing.T) {
	gpus := []inventory.GPU{{UUID: "a", Healthy: true}, {UUID: "b"}, {UUID: "a"}, {UUID: "c", Healthy: true}}
	for _, tc := range []struct {
		uuid                string
		healthy, wantListed bool
	}{
		{"a", false, true},
		{"b", false, true},
		{"c", true, true},
		{"d", false, false},
	} {
		if h, listed := healthOf(gpus, tc.uuid); h != tc.healthy || listed != tc.wantListed {
			t.Errorf("%s: healthy %v listed %v, want %v %v", tc.uuid, h, listed, tc.healthy, tc.wantListed)
		}
	}
	if _, listed := healthOf(nil, "a"); listed {
		t.Errorf("a node not seen before lists a GPU")
	}
}
