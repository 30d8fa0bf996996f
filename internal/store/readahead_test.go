package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestWatchInitialStateReadAhead: an initial state of more keys than the
// read-ahead window, some of them refused (not JSON, another node's
// document), one deleted, comes as before reading ahead: every key once,
// in stream order, with its document, the refused ones rejected for
// their reason, then Synced, then later changes as they come.
func TestWatchInitialStateReadAhead(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	const n = 3*readAheadWindow + 7
	want := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("n%03d", i)
		doc, op := testDoc(t, id), "changed"
		switch i % 50 {
		case 3:
			doc, op = []byte("{not json"), "rejected"
		case 7:
			doc, op = testDoc(t, "someone-else"), "rejected"
		}
		if _, err := s.Put(ctx, id, doc, false, time.Minute); err != nil {
			t.Fatal(err)
		}
		want[id] = op
	}
	if err := s.Delete(ctx, "n005", time.Minute); err != nil {
		t.Fatal(err)
	}
	want["n005"] = "removed"
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var last uint64
	for synced := false; !synced; {
		select {
		case ev := <-events:
			if ev.Op == Synced {
				synced = true
				continue
			}
			if ev.Revision <= last {
				t.Fatalf("%s at revision %d after %d: out of order", ev.NodeID, ev.Revision, last)
			}
			last = ev.Revision
			if _, dup := got[ev.NodeID]; dup {
				t.Fatalf("%s delivered twice", ev.NodeID)
			}
			got[ev.NodeID] = ev.Op.String()
			if ev.Op == Changed && ev.Inventory.NodeID != ev.NodeID {
				t.Fatalf("%s delivered with %q's document", ev.NodeID, ev.Inventory.NodeID)
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d keys before Synced", len(got), len(want))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("initial state\n%v\nwant\n%v", got, want)
	}
	if _, err := s.Put(ctx, "n001", testDoc(t, "n001"), false, time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev.Op != Changed || ev.NodeID != "n001" {
			t.Fatalf("after Synced: %s %s", ev.Op, ev.NodeID)
		}
	case <-ctx.Done():
		t.Fatal("no change after Synced")
	}
}
