package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/bus"
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

// TestLeaderValue: the value of a message as the stream's leader has it
// (what a watch reads where a replica's direct get missed it); a message
// that is gone, of another key or a removal is not found.
func TestLeaderValue(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	doc := testDoc(t, "n1")
	r1, err := s.Put(ctx, "n1", doc, false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "n2", testDoc(t, "n2"), false, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "n2", time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := s.js.Stream(ctx, bus.InventoryStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	marker := info.State.LastSeq
	for _, tc := range []struct {
		name    string
		subject string
		seq     uint64
		want    []byte
	}{
		{"its value", bus.InventorySubjectPrefix + "n1", r1, doc},
		{"another key's message", bus.InventorySubjectPrefix + "n2", r1, nil},
		{"a delete marker", bus.InventorySubjectPrefix + "n2", marker, nil},
		{"past the stream's end", bus.InventorySubjectPrefix + "n1", marker + 10, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.leaderValue(ctx, tc.subject, tc.seq)
			if tc.want == nil {
				if !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("leaderValue = %q, %v; want ErrKeyNotFound", got, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("leaderValue = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
