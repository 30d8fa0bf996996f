package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// backend is one implementation of the service's stores (stores.go),
// with the reporters' and operators' side a test needs: JetStream's or
// memJS's.
type backend struct {
	name   string
	plans  func(publisher string) planStore
	specs  specStore
	drains drainStore
	inv    inventoryStore
	// put, remove and unspec write as a reporter and an operator do.
	put    func(t *testing.T, n inventory.NodeInventory, ttl time.Duration) uint64
	remove func(t *testing.T, id string)
	unspec func(t *testing.T, name string)
	// lapse lets d pass for TTLs (the real server's by waiting, memJS's
	// by moving its clock).
	lapse func(d time.Duration)
}

// backends are JetStream's stores, on a natstest server, and memJS's.
func backends(t *testing.T) []backend {
	h := newHarness(t)
	js := h.js
	invs := store.NewInventoryStore(js)
	specs := store.NewSpecStore(js)
	real := backend{
		name: "jetstream",
		plans: func(pub string) planStore {
			ps := store.NewPlanStore(js)
			ps.Publisher, ps.LeaseName = pub, bus.LeaseName
			return jsPlans{ps}
		},
		specs:  jsSpecs{specs},
		drains: newJSDrains(js, 0),
		inv:    jsInventory{invs},
		put: func(t *testing.T, n inventory.NodeInventory, ttl time.Duration) uint64 {
			doc, _ := json.Marshal(n)
			rev, err := invs.Put(context.Background(), n.NodeID, doc, false, ttl)
			if err != nil {
				t.Fatal(err)
			}
			return rev
		},
		remove: func(t *testing.T, id string) {
			if err := invs.Delete(context.Background(), id, time.Minute); err != nil {
				t.Fatal(err)
			}
		},
		unspec: func(t *testing.T, name string) {
			if err := specs.Delete(context.Background(), name); err != nil {
				t.Fatal(err)
			}
		},
		lapse: func(d time.Duration) {
			end := time.Now().Add(d)
			natstest.WaitFor(t, d+10*time.Second, "time to pass", func() bool { return time.Now().After(end) })
		},
	}
	clock := &skewClock{}
	m := newMemJS(clock)
	mem := backend{
		name:   "memory",
		plans:  func(pub string) planStore { return m.plans(pub) },
		specs:  memSpecs{m.specs},
		drains: memDrains{m.drains},
		inv:    memInventory{m.inv},
		put: func(t *testing.T, n inventory.NodeInventory, ttl time.Duration) uint64 {
			rev, err := memInventory{m.inv}.put(n, false, ttl)
			if err != nil {
				t.Fatal(err)
			}
			return rev
		},
		remove: func(t *testing.T, id string) { memInventory{m.inv}.remove(id, time.Minute) },
		unspec: func(t *testing.T, name string) { memSpecs{m.specs}.delete(name) },
		lapse:  clock.advance,
	}
	m.drains.gone = true // the planner makes it at start, as on a new server
	return []backend{real, mem}
}

// TestMemStoresAsJetStream: memJS keeps the promises of JetStream's
// stores that the service builds on; each case runs on both, with the
// same assertions.
func TestMemStoresAsJetStream(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("plan events fenced by the last sequence", func(t *testing.T) { planFencing(t, b) })
			t.Run("lease", func(t *testing.T) { leaseFencing(t, b) })
			t.Run("follow", func(t *testing.T) { follow(t, b) })
			t.Run("retain", func(t *testing.T) { retain(t, b) })
			t.Run("assignments", func(t *testing.T) { assignments(t, b) })
			t.Run("spec bucket", func(t *testing.T) { specBucket(t, b) })
			t.Run("drain bucket", func(t *testing.T) { drainBucket(t, b) })
			t.Run("inventory watch", func(t *testing.T) { inventoryWatch(t, b) })
		})
	}
}

// wholeEvent is revision rev of plan name, whole, with one worker.
func wholeEvent(name string, rev int) *plan.Event {
	pl := &plan.Placement{}
	return &plan.Event{Header: plan.Header{Name: name, Revision: rev, Status: plan.Status{State: plan.StateValid}, Reason: "test"}, Base: rev, Placement: pl}
}

func planFencing(t *testing.T, b backend) {
	ctx := context.Background()
	ps := b.plans("a")
	if err := ps.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if sp, err := ps.Latest(ctx, "p"); err != nil || sp != nil {
		t.Fatalf("Latest of a plan with no revision = %v, %v; want nil, nil", sp, err)
	}
	s1, err := ps.PublishEvent(ctx, wholeEvent("p", 1), "d1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Expecting none where there is one: another planner published first.
	if _, err := ps.PublishEvent(ctx, wholeEvent("p", 2), "d1", 0, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("publish expecting no event = %v, want ErrConflict", err)
	}
	if _, err := ps.PublishEvent(ctx, wholeEvent("p", 2), "d1", s1+100, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("publish expecting a later sequence = %v, want ErrConflict", err)
	}
	s2, err := ps.PublishEventFor(ctx, wholeEvent("p", 2), store.Digests{Spec: "d2", PlacedFor: "d1"}, s1, 0)
	if err != nil || s2 <= s1 {
		t.Fatalf("publish at the last sequence = %d, %v; want a sequence past %d", s2, err, s1)
	}
	// One message id a revision: a second revision 2 is refused.
	if _, err := ps.PublishEvent(ctx, wholeEvent("p", 2), "d2", s2, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second revision 2 = %v, want ErrConflict", err)
	}
	// Another plan's subject has its own last sequence.
	if _, err := ps.PublishEvent(ctx, wholeEvent("q", 1), "dq", 0, 0); err != nil {
		t.Fatal(err)
	}
	sp, err := ps.Latest(ctx, "p")
	if err != nil || sp == nil {
		t.Fatalf("Latest = %v, %v", sp, err)
	}
	if sp.Plan.Revision != 2 || sp.Seq != s2 || sp.SpecDigest != "d2" || sp.PlacedFor != "d1" || sp.Publisher != "a" || sp.Unreadable {
		t.Errorf("Latest = revision %d seq %d digest %q placed for %q publisher %q unreadable %v; want 2 %d d2 d1 a false",
			sp.Plan.Revision, sp.Seq, sp.SpecDigest, sp.PlacedFor, sp.Publisher, sp.Unreadable, s2)
	}
	r1, err := ps.Revision(ctx, "p", 1)
	if err != nil || r1.Plan.Revision != 1 || r1.Seq != s1 || r1.SpecDigest != "d1" || r1.PlacedFor != "" {
		t.Errorf("Revision 1 = %+v, %v", r1, err)
	}
	if _, err := ps.Revision(ctx, "p", 9); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Revision 9 = %v, want ErrNotFound", err)
	}
	if last, err := ps.LastEvent(ctx, client.PlanEventSubject("p")); err != nil || last != (store.LastMessage{Seq: s2, Revision: 2}) {
		t.Errorf("LastEvent = %+v, %v; want sequence %d, revision 2", last, err, s2)
	}
	if last, err := ps.LastEvent(ctx, client.PlanEventSubject("nothing-here")); err != nil || last != (store.LastMessage{}) {
		t.Errorf("LastEvent of a plan never published = %+v, %v; want none", last, err)
	}
	// Changes: revisions 3 and 4 rebuilt from base 2 through the chain.
	pool := plan.PoolOrder{Name: "train", Add: []string{"n1"}}
	change := func(rev int, reason string, pools ...plan.PoolOrder) *plan.Event {
		return &plan.Event{Header: plan.Header{Name: "p", Revision: rev, Status: plan.Status{State: plan.StateValid}, Reason: reason}, Base: 2,
			Change: &plan.Change{Pools: pools}}
	}
	s3, err := ps.PublishEvent(ctx, change(3, "three", pool), "d2", s2, 0)
	if err != nil {
		t.Fatal(err)
	}
	s4, err := ps.PublishEvent(ctx, change(4, "four", pool, plan.PoolOrder{Name: "env"}), "d2", s3, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rev    int
		seq    uint64
		reason string
		pools  []string
	}{{3, s3, "three", []string{"train"}}, {4, s4, "four", []string{"train", "env"}}} {
		sp, err := ps.Revision(ctx, "p", c.rev)
		if err != nil {
			t.Fatal(err)
		}
		var pools []string
		for _, pl := range sp.Plan.Pools {
			pools = append(pools, pl.Name)
		}
		if sp.Seq != c.seq || sp.Base != 2 || sp.Plan.Reason != c.reason || !slices.Equal(pools, c.pools) {
			t.Errorf("revision %d = seq %d base %d reason %q pools %v; want %d 2 %q %v",
				c.rev, sp.Seq, sp.Base, sp.Plan.Reason, pools, c.seq, c.reason, c.pools)
		}
	}
	// A change that skips a revision breaks its chain: unreadable.
	s6, err := ps.PublishEvent(ctx, change(6, "six", pool), "d2", s4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sp, err := ps.Latest(ctx, "p"); err != nil || !sp.Unreadable || sp.Plan.Revision != 6 || sp.Seq != s6 {
		t.Fatalf("Latest of a broken chain = %+v, %v; want revision 6 unreadable", sp, err)
	}
	// A snapshot names the whole document; dropped, its revision is
	// unreadable, never an error that stops planning.
	doc := &plan.Document{Header: plan.Header{Name: "p", Revision: 7, Status: plan.Status{State: plan.StateValid}, Reason: "snap"}}
	obj, _, err := ps.PutSnapshot(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	s7, err := ps.PublishEvent(ctx, &plan.Event{Header: doc.Header, Base: 7, Snapshot: obj}, "d2", s6, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sp, err := ps.Latest(ctx, "p"); err != nil || sp.Plan.Revision != 7 || sp.Plan.Reason != "snap" || sp.Unreadable {
		t.Fatalf("Latest of a snapshot = %+v, %v", sp, err)
	}
	ps.DropSnapshot(ctx, obj)
	sp, err = ps.Latest(ctx, "p")
	if err != nil || !sp.Unreadable || sp.Plan.Revision != 7 || sp.Seq != s7 {
		t.Errorf("Latest with its snapshot gone = %+v, %v; want revision 7 unreadable at %d", sp, err, s7)
	}
}

func leaseFencing(t *testing.T, b backend) {
	ctx := context.Background()
	a, c := b.plans("a"), b.plans("c")
	if err := a.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := a.ReadLease(ctx, bus.LeaseName); err != nil || l != nil {
		t.Fatalf("ReadLease of none = %v, %v", l, err)
	}
	lease := &bus.Lease{Holder: "a", TTLSeconds: 60}
	seq, err := a.WriteLease(ctx, bus.LeaseName, lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteLease(ctx, bus.LeaseName, &bus.Lease{Holder: "c", TTLSeconds: 60}, 0); !errors.Is(err, bus.ErrLeaseHeld) {
		t.Fatalf("taking a held lease = %v, want ErrLeaseHeld", err)
	}
	if l, err := c.ReadLease(ctx, bus.LeaseName); err != nil || l == nil || l.Holder != "a" || l.Seq != seq {
		t.Fatalf("ReadLease = %+v, %v; want a's at %d", l, err, seq)
	}
	if _, err := a.PublishEvent(ctx, wholeEvent("leased", 1), "d", 0, seq); err != nil {
		t.Fatalf("publish on the lease held = %v", err)
	}
	renewed, err := a.WriteLease(ctx, bus.LeaseName, lease, seq)
	if err != nil {
		t.Fatal(err)
	}
	// The old lease's sequence fences no more.
	if _, err := a.PublishEvent(ctx, wholeEvent("leased", 2), "d", 0, seq); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("publish on a lease renewed since = %v, want ErrLeaseLost", err)
	}
	if err := c.ReleaseLease(ctx, bus.LeaseName, seq); err != nil {
		t.Fatal(err)
	}
	if l, _ := a.ReadLease(ctx, bus.LeaseName); l == nil || l.Seq != renewed {
		t.Fatalf("a release at an old sequence gave the lease back: %+v", l)
	}
	if err := a.ReleaseLease(ctx, bus.LeaseName, renewed); err != nil {
		t.Fatal(err)
	}
	if l, err := c.ReadLease(ctx, bus.LeaseName); err != nil || l != nil {
		t.Fatalf("ReadLease after release = %+v, %v", l, err)
	}
	// A lease lapses by its TTL.
	short, err := c.WriteLease(ctx, bus.LeaseName, &bus.Lease{Holder: "c", TTLSeconds: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.lapse(1500 * time.Millisecond)
	if l, err := a.ReadLease(ctx, bus.LeaseName); err != nil || l != nil {
		t.Fatalf("ReadLease of a lapsed lease = %+v, %v", l, err)
	}
	if _, err := c.PublishEvent(ctx, wholeEvent("leased", 2), "d", 0, short); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("publish on a lapsed lease = %v, want ErrLeaseLost", err)
	}
}

func follow(t *testing.T, b backend) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, c := b.plans("a"), b.plans("c")
	s1, err := c.PublishEvent(ctx, wholeEvent("f", 1), "d", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := a.Follow(ctx, "f", func(i client.Info) bool { return i.Publisher == "a" })
	if err != nil {
		t.Fatal(err)
	}
	s2, err := a.PublishEvent(ctx, wholeEvent("f", 2), "d", s1, 0) // a's own: skipped
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishEvent(ctx, wholeEvent("f", 3), "d", s2, 0); err != nil {
		t.Fatal(err)
	}
	var got []int
	for len(got) < 2 {
		select {
		case sp := <-ch:
			got = append(got, sp.Plan.Revision)
		case <-time.After(10 * time.Second):
			t.Fatalf("follow delivered %v, want [1 3]", got)
		}
	}
	if !slices.Equal(got, []int{1, 3}) {
		t.Errorf("follow delivered %v, want [1 3] (the latest, then what skip keeps)", got)
	}
}

func specBucket(t *testing.T, b backend) {
	ctx := context.Background()
	if _, err := b.specs.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.specs.Put(ctx, "s", []byte("not: [a spec")); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("Put of a bad spec = %v, want ErrBadRequest", err)
	}
	r1, err := b.specs.Put(ctx, "s", []byte(testSpec))
	if err != nil {
		t.Fatal(err)
	}
	e, err := b.specs.Entry(ctx, "s")
	if err != nil || e.Revision != r1 || string(e.Spec) != testSpec {
		t.Fatalf("Entry = %+v, %v; want revision %d", e, err, r1)
	}
	kv, err := b.specs.Bucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "s", []byte(testSpec)); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("Create over a spec = %v, want ErrKeyExists", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := kv.WatchAll(wctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	next := func() jetstream.KeyValueEntry {
		t.Helper()
		select {
		case e := <-w.Updates():
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("the watch delivered nothing")
			return nil
		}
	}
	if e := next(); e == nil || e.Key() != "s" || e.Revision() != r1 {
		t.Fatalf("watch's first entry = %v, want s at %d", e, r1)
	}
	if e := next(); e != nil {
		t.Fatalf("watch's second entry = %v, want nil (the bucket read)", e)
	}
	r2, err := b.specs.Put(ctx, "s", []byte(testSpec+"\n# again\n"))
	if err != nil || r2 <= r1 {
		t.Fatalf("second Put = %d, %v", r2, err)
	}
	if e := next(); e.Revision() != r2 || e.Operation() != jetstream.KeyValuePut {
		t.Fatalf("watch after Put = %s at %d, want a put at %d", e.Operation(), e.Revision(), r2)
	}
	b.unspec(t, "s")
	del := next()
	if del.Key() != "s" || del.Operation() != jetstream.KeyValueDelete || del.Revision() <= r2 {
		t.Fatalf("watch after delete = %s %s at %d, want a delete of s past %d", del.Key(), del.Operation(), del.Revision(), r2)
	}
	hist, err := kv.History(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	var revs []uint64
	for _, h := range hist {
		revs = append(revs, h.Revision())
	}
	if !slices.Equal(revs, []uint64{r1, r2, del.Revision()}) {
		t.Errorf("History revisions = %v, want %v", revs, []uint64{r1, r2, del.Revision()})
	}
	if _, err := b.specs.Entry(ctx, "s"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Entry of a deleted spec = %v, want ErrNotFound", err)
	}
	if rec, err := b.specs.Records(ctx); err != nil || !rec.Keys["s"] || rec.LastSeq < del.Revision() {
		t.Errorf("Records = %+v, %v; want s kept (its delete marker), last sequence at least %d", rec, err, del.Revision())
	}
	// A removed spec may be created again.
	if _, err := kv.Create(ctx, "s", []byte(testSpec)); err != nil {
		t.Errorf("Create after delete = %v", err)
	}
}

func drainBucket(t *testing.T, b backend) {
	ctx := context.Background()
	d := store.Drain{NodeID: "n1", Cause: plan.DrainOperator, Reason: "maintenance", By: "ops", At: time.Unix(1_000_000, 0).UTC()}
	if _, err := b.drains.Bucket(ctx); !errors.Is(err, store.ErrNoDrainBucket) {
		t.Fatalf("Bucket before Ensure = %v, want ErrNoDrainBucket", err)
	}
	if err := b.drains.Put(ctx, d); !errors.Is(err, store.ErrNoDrainBucket) {
		t.Fatalf("Put before Ensure = %v, want ErrNoDrainBucket (only Ensure makes the bucket)", err)
	}
	if _, err := b.drains.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.drains.Put(ctx, store.Drain{NodeID: "bad node!"}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("Put of a bad drain = %v, want ErrBadRequest", err)
	}
	if err := b.drains.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	kv, err := b.drains.Bucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, d.Key(), []byte("{}")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("Create over a drain = %v, want ErrKeyExists", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	select {
	case e := <-w.Updates():
		var got store.Drain
		if e == nil || e.Key() != d.Key() || json.Unmarshal(e.Value(), &got) != nil || got.Reason != d.Reason {
			t.Errorf("watch's first entry = %v, want the drain of n1", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drain watch delivered nothing")
	}
}

func inventoryWatch(t *testing.T, b backend) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := b.inv.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	node := func(id string) inventory.NodeInventory {
		var n inventory.NodeInventory
		if err := json.Unmarshal(simDoc(id), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	r1 := b.put(t, node("n1"), time.Minute)
	r2 := b.put(t, node("n2"), time.Minute)
	lastIs := func(want uint64) {
		t.Helper()
		if got, err := b.inv.LastRevision(ctx); err != nil || got != want {
			t.Fatalf("LastRevision = %d, %v; want %d (the last put's)", got, err, want)
		}
	}
	lastIs(r2)
	ch, err := b.inv.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func() store.Event {
		t.Helper()
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatal("the inventory watch ended")
				}
				if ev.Op != store.Heartbeat {
					return ev
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the inventory watch delivered nothing")
			}
		}
	}
	type seen struct {
		op     store.EventOp
		id     string
		rev    uint64
		reason string
		marker bool
	}
	see := func(ev store.Event) seen { return seen{ev.Op, ev.NodeID, ev.Revision, ev.Reason, ev.Marker} }
	want := []seen{{store.Changed, "n1", r1, "", false}, {store.Changed, "n2", r2, "", false}, {store.Synced, "", 0, "", false}}
	for i, w := range want {
		if got := see(next()); got != w {
			t.Fatalf("event %d = %+v, want %+v", i, got, w)
		}
	}
	if _, err := b.inv.Tombstone(ctx, "n2", time.Minute, r2); !errors.Is(err, store.ErrKeyMoved) {
		t.Fatalf("Tombstone of a key that holds a document = %v, want ErrKeyMoved", err)
	}
	r3 := b.put(t, node("n3"), time.Second)
	lastIs(r3)
	if got := see(next()); got != (seen{store.Changed, "n3", r3, "", false}) {
		t.Fatalf("after a put: %+v", got)
	}
	b.remove(t, "n1")
	if got := next(); got.Op != store.Removed || got.NodeID != "n1" || got.Reason != store.ReasonDeleted || !got.Marker {
		t.Fatalf("after a delete: %+v, want n1 removed (deleted, by a marker)", see(got))
	}
	// n3's key runs out: the watch says so by itself, without a marker.
	b.lapse(2 * time.Second)
	if got := next(); got.Op != store.Removed || got.NodeID != "n3" || got.Reason != store.ReasonExpired || got.Marker || got.Revision != r3 {
		t.Fatalf("after n3's TTL: %+v, want n3 removed (expired, no marker) at %d", see(got), r3)
	}
	if _, err := b.inv.Tombstone(ctx, "n3", time.Minute, r3); err != nil {
		t.Fatalf("Tombstone of an expired key = %v", err)
	}
	if got := next(); got.Op != store.Removed || got.NodeID != "n3" || got.Reason != store.ReasonExpired || !got.Marker {
		t.Fatalf("after n3's tombstone: %+v, want n3 removed (expired, by a marker)", see(got))
	}
}

func retain(t *testing.T, b backend) {
	ctx := context.Background()
	ps := b.plans("a")
	var seq uint64
	publish := func(ev *plan.Event) {
		t.Helper()
		var err error
		if seq, err = ps.PublishEvent(ctx, ev, "d", seq, 0); err != nil {
			t.Fatal(err)
		}
	}
	change := func(rev, base int) *plan.Event {
		return &plan.Event{Header: plan.Header{Name: "r", Revision: rev, Status: plan.Status{State: plan.StateValid}}, Base: base, Change: &plan.Change{}}
	}
	publish(wholeEvent("r", 1))
	publish(change(2, 1))
	publish(wholeEvent("r", 3))
	publish(change(4, 3))
	// No limit reached: all kept.
	if err := ps.Retain(ctx, "r", time.Hour, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Revision(ctx, "r", 1); err != nil {
		t.Fatalf("revision 1 within the age limit: %v", err)
	}
	// Every revision past the age limit: the cut keeps the newest whole
	// one and what builds on it.
	if err := ps.Retain(ctx, "r", time.Hour, -1, time.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for rev, kept := range map[int]bool{1: false, 2: false, 3: true, 4: true} {
		sp, err := ps.Revision(ctx, "r", rev)
		switch {
		case kept && (err != nil || sp.Plan.Revision != rev):
			t.Errorf("revision %d: %v, want it kept and rebuilt", rev, err)
		case !kept && !errors.Is(err, client.ErrNotFound):
			t.Errorf("revision %d: %v, want ErrNotFound (cut)", rev, err)
		}
	}
}

func assignments(t *testing.T, b backend) {
	ctx := context.Background()
	ps := b.plans("a")
	if err := ps.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	as := []client.Assignment{{Plan: "as", Revision: 1, NodeID: "n1"}, {Plan: "as", Revision: 1, NodeID: "n2"}}
	if refused, err := ps.PublishAssignments(ctx, as, true); err != nil || refused != 0 {
		t.Fatalf("first assignments: %d refused, %v", refused, err)
	}
	if as[0].Seq == 0 || as[1].Seq <= as[0].Seq {
		t.Fatalf("sequences %d, %d: want each set, in order", as[0].Seq, as[1].Seq)
	}
	// n1's replaces the one at its Seq; n2's is stale (expects none).
	next := []client.Assignment{{Plan: "as", Revision: 2, NodeID: "n1", Seq: as[0].Seq}, {Plan: "as", Revision: 2, NodeID: "n2"}}
	if refused, err := ps.PublishAssignments(ctx, next, true); err != nil || refused != 1 || next[1].Seq != 0 || next[0].Seq <= as[1].Seq {
		t.Fatalf("second assignments: %d refused (want 1), %v; sequences %d, %d", refused, err, next[0].Seq, next[1].Seq)
	}
	a, err := ps.Assignment(ctx, "as", "n1")
	if err != nil || a.Revision != 2 || a.Seq != next[0].Seq {
		t.Fatalf("n1's assignment = %+v, %v; want revision 2 at %d", a, err, next[0].Seq)
	}
	if _, err := ps.Assignment(ctx, "as", "n9"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("an assignment never published = %v, want ErrNotFound", err)
	}
	var got []string
	err = ps.Assignments(ctx, "as", func(a *client.Assignment) bool {
		got = append(got, fmt.Sprintf("%s@%d", a.NodeID, a.Revision))
		return true
	})
	if err != nil || !slices.Equal(got, []string{"n2@1", "n1@2"}) {
		t.Errorf("Assignments = %v, %v; want [n2@1 n1@2] (each node's last, in stream order)", got, err)
	}
}
