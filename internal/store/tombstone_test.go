package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestTombstone: a key whose TTL ran out is noticed with its last
// revision and TTL; its tombstone is a KV delete that a plain KV
// watcher sees, and that Watch takes for the expiry it is (not a
// reporter's delete); a key written again since keeps its value
// (ErrKeyMoved), and so does a key already deleted.
func TestTombstone(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	kv, err := s.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kvw, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer kvw.Stop()
	next := func(what string) Event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-ctx.Done():
			t.Fatalf("no event: %s", what)
			return Event{}
		}
	}
	if ev := next("synced"); ev.Op != Synced {
		t.Fatalf("first event %v, want synced", ev.Op)
	}
	rev, err := s.Put(ctx, "n1", testDoc(t, "n1"), false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ev := next("n1 changed"); ev.Op != Changed || ev.TTL != time.Second || ev.Revision != rev {
		t.Fatalf("event %+v, want n1 changed at revision %d with a 1s TTL", ev, rev)
	}
	ev := next("n1 expired")
	if ev.Op != Removed || ev.Reason != ReasonExpired || ev.Marker || ev.Revision != rev || ev.TTL != time.Second {
		t.Fatalf("event %+v, want n1 expired (no marker) after revision %d, 1s TTL", ev, rev)
	}

	mark, err := s.Tombstone(ctx, "n1", ev.TTL, ev.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if ev := next("n1's tombstone"); ev.Op != Removed || ev.Reason != ReasonExpired || !ev.Marker || ev.Revision != mark {
		t.Fatalf("event %+v, want n1's tombstone at %d read as its expiry", ev, mark)
	}
	for deleted := false; !deleted; {
		select {
		case e := <-kvw.Updates():
			deleted = e != nil && e.Key() == "n1" && e.Operation() == jetstream.KeyValueDelete && e.Revision() == mark
		case <-ctx.Done():
			t.Fatal("a KV watcher never saw n1's tombstone")
		}
	}
	if _, err := s.Tombstone(ctx, "n1", time.Second, rev); !errors.Is(err, ErrKeyMoved) {
		t.Errorf("a second tombstone over the first: %v", err)
	}

	// Written again before the tombstone: the key stays.
	back, err := s.Put(ctx, "n2", testDoc(t, "n2"), false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tombstone(ctx, "n2", time.Minute, back-1); !errors.Is(err, ErrKeyMoved) {
		t.Fatalf("a tombstone over a live key: %v", err)
	}
	if _, got, err := s.Get(ctx, "n2"); err != nil || got != back {
		t.Errorf("n2 after a refused tombstone: revision %d, %v; want %d", got, err, back)
	}
}
