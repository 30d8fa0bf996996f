package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/plan"
)

func TestParseTarget(t *testing.T) {
	three := 3
	cases := []struct {
		in    string
		node  string
		gpu   *int
		wrong string
	}{
		{in: "n2", node: "n2"},
		{in: "gpu-07.rack1.example", node: "gpu-07.rack1.example"},
		{in: "n2:3", node: "n2", gpu: &three},
		{in: "n2:", wrong: "GPU index"},
		{in: "n2:x", wrong: "GPU index"},
		{in: "n2:64", wrong: "GPU index"},
		{in: "n2:-1", wrong: "GPU index"},
		{in: "", wrong: "node id"},
		{in: "n 2", wrong: "node id"},
	}
	for _, c := range cases {
		node, gpu, err := ParseTarget(c.in)
		if c.wrong != "" {
			if err == nil || !strings.Contains(err.Error(), c.wrong) {
				t.Errorf("ParseTarget(%q): err %v, want one saying %q", c.in, err, c.wrong)
			}
			continue
		}
		if err != nil || node != c.node || (gpu == nil) != (c.gpu == nil) || gpu != nil && *gpu != *c.gpu {
			t.Errorf("ParseTarget(%q) = %q, %v, %v", c.in, node, gpu, err)
		}
	}
}

// TestDrainKeyRoundTrip: every node id (dots and all) and GPU index
// make a key that reads back as the same, and no node's key is a GPU's.
func TestDrainKeyRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		node := rapid.StringMatching(`[a-z0-9]([a-z0-9_=/-]{0,8}(\.[a-z0-9][a-z0-9-]{0,4}){0,3})?`).Draw(t, "node")
		var gpu *int
		if rapid.Bool().Draw(t, "gpu?") {
			g := rapid.IntRange(0, 63).Draw(t, "gpu")
			gpu = &g
		}
		key := DrainKey(node, gpu)
		n, g, err := ParseDrainKey(key)
		if err != nil || n != node || (g == nil) != (gpu == nil) || g != nil && *g != *gpu {
			t.Fatalf("key %q reads back as %q, %v, %v", key, n, g, err)
		}
		target := plan.Drain{NodeID: node, GPU: gpu}.Target()
		n, g, err = ParseTarget(target)
		if err != nil || n != node || (g == nil) != (gpu == nil) || g != nil && *g != *gpu {
			t.Fatalf("target %q reads back as %q, %v, %v", target, n, g, err)
		}
	})
}

// TestDrainStore: a drain put is listed; an undrain records who and
// when in the key's history, then removes it; undraining what is not
// drained is not found; a bad record is refused.
func TestDrainStore(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js, _ := jetstream.New(srv.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := NewDrainStore(js)
	gpu := 3
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []Drain{
		{NodeID: "n2", Cause: plan.DrainOperator, Reason: "driver upgrade", By: "alice@h1", At: at},
		{NodeID: "n1", GPU: &gpu, Cause: plan.DrainOperator, By: "bob@h2", At: at},
	} {
		if err := s.Put(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	got, bad, err := s.List(ctx)
	if err != nil || len(bad) != 0 || len(got) != 2 || got[0].Target() != "n1:3" || got[1].Target() != "n2" || got[1].Reason != "driver upgrade" {
		t.Fatalf("list: %+v, bad %v, err %v", got, bad, err)
	}
	if err := s.Undrain(ctx, "n2", nil, "carol@h3", "admin", at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.List(ctx); len(got) != 1 || got[0].Target() != "n1:3" {
		t.Fatalf("after undrain: %+v", got)
	}
	kv, _ := s.KV(ctx)
	hist, err := kv.History(ctx, "node.n2")
	if err != nil || len(hist) != 3 {
		t.Fatalf("history of node.n2: %d entries, %v", len(hist), err)
	}
	rec, err := DecodeDrain("node.n2", hist[1].Value())
	if err != nil || !rec.Undrained || rec.By != "carol@h3" || rec.Role != "admin" || !rec.At.Equal(at.Add(time.Hour)) {
		t.Errorf("undrain record %+v, %v", rec, err)
	}
	if err := s.Undrain(ctx, "n2", nil, "x", "", at); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("undrain of a node not drained: %v", err)
	}
	if err := s.Put(ctx, Drain{NodeID: "n1", Cause: "whim"}); !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), "cause") {
		t.Errorf("a bad cause: %v", err)
	}
}
