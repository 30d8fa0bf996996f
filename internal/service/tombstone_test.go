package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestExpiredNodeTombstone: a node's key runs out (its reporter died
// without deleting it); the leading planner writes the key's delete
// marker, and a plain KV watcher of the inventory bucket (as `nats kv
// watch`) sees the node go.
func TestExpiredNodeTombstone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.node("n1")
	h.node("n2")
	defer h.planner(context.Background(), shareSpec(8, 0))()
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	kv, err := h.js.KeyValue(ctx, client.InventoryBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "n2")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	h.kill("n2")
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() == jetstream.KeyValueDelete {
				if _, err := kv.Get(ctx, "n1"); err != nil {
					t.Errorf("the live node's key: %v", err)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no KV watcher was told that n2's key expired")
		}
	}
}

// TestTombstoneSparesNodeBack: the writer of tombstones, for a key it
// found expired, deletes it only if it still holds nothing: a node
// whose reporter put it again before the planner wrote the marker keeps
// it; one still gone gets its delete marker; a standby writes none, and
// keeps them for when it leads.
func TestTombstoneSparesNodeBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	p := New(Config{NC: h.nc, JS: h.js, NoService: true, Log: zerolog.Nop()})
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := h.js.KeyValue(ctx, client.InventoryBucket)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]uint64{}
	for _, id := range []string{"back", "gone"} {
		rev, err := p.inv.(jsInventory).Put(ctx, id, simDoc(id), false, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		seen[id] = rev
	}
	for _, id := range []string{"back", "gone"} {
		natstest.WaitFor(t, 10*time.Second, "key "+id+" expired", func() bool {
			_, err := kv.Get(ctx, id)
			return errors.Is(err, jetstream.ErrKeyNotFound)
		})
	}
	back, err := p.inv.(jsInventory).Put(ctx, "back", simDoc("back"), false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	ts := newTombstones(p, zerolog.Nop())
	for _, id := range []string{"back", "gone"} {
		ts.event(store.Event{Op: store.Removed, NodeID: id, Reason: store.ReasonExpired, Revision: seen[id], TTL: time.Second})
	}
	if !ts.write(ctx) || len(ts.pending()) != 2 {
		t.Fatalf("a standby's writes: pending %v", ts.pending())
	}
	p.fence.seq.Store(1) // leads
	if !ts.write(ctx) || len(ts.pending()) != 0 {
		t.Fatalf("the leader's writes: pending %v", ts.pending())
	}
	if e, err := kv.Get(ctx, "back"); err != nil || e.Revision() != back {
		t.Errorf("the node that came back: %v (want revision %d)", err, back)
	}
	hist, err := kv.History(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if last := hist[len(hist)-1]; last.Operation() != jetstream.KeyValueDelete {
		t.Errorf("the node still gone: last %v, want its delete marker", last.Operation())
	}
}
