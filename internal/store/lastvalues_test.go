package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
)

// TestListBatchedIsListEach: the batched listing (over 1,024 keys, so
// several batches) reads what key-by-key reads do: the latest of each
// key after heartbeats, no deleted key, in id order.
func TestListBatchedIsListEach(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	s := NewInventoryStore(js)
	const n = 2600
	for i := range n {
		id := fmt.Sprintf("n%04d", i)
		if _, err := s.Put(ctx, id, testDoc(t, id), false, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 7 {
		id := fmt.Sprintf("n%04d", i)
		if _, err := s.Put(ctx, id, testDoc(t, id), true, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{0, 1024, 2599} {
		if err := s.Delete(ctx, fmt.Sprintf("n%04d", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := bucketKeys(ctx, js, "poolplanner-inventory")
	if err != nil {
		t.Fatal(err)
	}
	each, err := s.listEach(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	batched, err := s.listBatched(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(each) != n-3 {
		t.Fatalf("key by key: %d nodes, want %d", len(each), n-3)
	}
	a, _ := json.Marshal(each)
	b, _ := json.Marshal(batched)
	if string(a) != string(b) {
		t.Fatalf("batched listing differs: %d nodes, key by key %d", len(batched), len(each))
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != n-3 {
		t.Fatalf("List: %d nodes, %v", len(list), err)
	}
}

// BenchmarkInventoryList lists 20,000 8-GPU nodes' inventories (planner
// status's unplanned use reads them all): batched direct gets against
// key by key.
func BenchmarkInventoryList(b *testing.B) {
	_, url := startServer(b)
	_, js := connect(b, url)
	ctx := context.Background()
	s := NewInventoryStore(js)
	const n = 20000
	for i := range n {
		id := fmt.Sprintf("n%05d", i)
		if _, err := s.Put(ctx, id, testDoc(b, id), false, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	ids, err := bucketKeys(ctx, js, "poolplanner-inventory")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		list func(context.Context, []string) ([]inventory.NodeInventory, error)
	}{{"batched", s.listBatched}, {"each", s.listEach}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got, err := c.list(ctx, ids); err != nil || len(got) != n {
					b.Fatalf("%d nodes, %v", len(got), err)
				}
			}
		})
	}
}

// TestListBatchedHostileHeaders: a reporter's own put carries headers of
// its choosing (Status, Nats-Subject, Nats-Stream); the batched listing
// still reads every node, each its own document, as key by key does:
// the server's headers, last, decide what a reply is.
func TestListBatchedHostileHeaders(t *testing.T) {
	for _, h := range []struct{ k, v string }{
		{"Status", "204"}, {"Status", "404"}, {"Status", "408"},
		{"Nats-Subject", "$KV.poolplanner-inventory.n0005"}, {"Nats-Sequence", "1"}, {"Nats-Stream", "OTHER"},
	} {
		t.Run(h.k+"="+h.v, func(t *testing.T) {
			_, url := startServer(t)
			_, js := connect(t, url)
			ctx := context.Background()
			s := NewInventoryStore(js)
			for i := range 10 {
				id := fmt.Sprintf("n%04d", i)
				if _, err := s.Put(ctx, id, testDoc(t, id), false, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			m := nats.NewMsg("$KV.poolplanner-inventory.n0002")
			m.Data = testDoc(t, "n0002")
			m.Header.Set(h.k, h.v)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			ids, err := bucketKeys(ctx, js, "poolplanner-inventory")
			if err != nil {
				t.Fatal(err)
			}
			each, err := s.listEach(ctx, ids)
			if err != nil {
				t.Fatal(err)
			}
			batched, err := s.listBatched(ctx, ids)
			if err != nil {
				t.Fatalf("batched: %v", err)
			}
			a, _ := json.Marshal(each)
			b, _ := json.Marshal(batched)
			if len(each) != 10 || string(a) != string(b) {
				t.Fatalf("batched listing differs: %d nodes, key by key %d", len(batched), len(each))
			}
		})
	}
}

// TestLastBatchPastByteLimit: a batch the server stops at its byte
// limit (it says how many it left) is asked again for the rest: every
// subject's last message comes back, each once.
func TestLastBatchPastByteLimit(t *testing.T) {
	_, url := startServer(t)
	nc, js := connect(t, url)
	ctx := context.Background()
	s := NewInventoryStore(js)
	var subjects []string
	for i := range 40 {
		id := fmt.Sprintf("n%04d", i)
		if _, err := s.Put(ctx, id, testDoc(t, id), false, time.Minute); err != nil {
			t.Fatal(err)
		}
		subjects = append(subjects, "$KV.poolplanner-inventory."+id)
	}
	subjects = append(subjects, "$KV.poolplanner-inventory.never-put")
	got, _, err := lastBatch(ctx, nc, "$JS.API.DIRECT.GET."+bus.InventoryStream, subjects, 0, 2<<10)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range got {
		if seen[v.Subject] {
			t.Fatalf("%s twice", v.Subject)
		}
		seen[v.Subject] = true
	}
	if len(got) != 40 {
		t.Fatalf("%d of 40 subjects read past the byte limit", len(got))
	}
}
