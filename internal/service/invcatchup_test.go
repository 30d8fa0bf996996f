package service

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// laggingInventory is an inventory store whose watch, once it has
// delivered the bucket's contents (Synced), holds every later event back
// until release is closed: a watch running behind the spec watch, as on
// a planner leading on another server than the one its nodes and spec
// were written through.
type laggingInventory struct {
	inventoryStore
	synced  chan struct{} // closed once Synced is delivered
	release chan struct{}
	// asked is closed at the first LastRevision.
	askedOnce *sync.Once
	asked     chan struct{}
}

func newLaggingInventory(inner inventoryStore) laggingInventory {
	return laggingInventory{inventoryStore: inner, synced: make(chan struct{}), release: make(chan struct{}),
		askedOnce: &sync.Once{}, asked: make(chan struct{})}
}

func (l laggingInventory) LastRevision(ctx context.Context) (uint64, error) {
	l.askedOnce.Do(func() { close(l.asked) })
	return l.inventoryStore.LastRevision(ctx)
}

func (l laggingInventory) Watch(ctx context.Context) (<-chan store.Event, error) {
	in, err := l.inventoryStore.Watch(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan store.Event, 64)
	go func() {
		defer close(out)
		held := false
		for ev := range in {
			if held {
				select {
				case <-l.release:
					held = false
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
			if ev.Op == store.Synced {
				select {
				case <-l.synced:
				default:
					close(l.synced)
					held = true
				}
			}
		}
	}()
	return out, nil
}

// fourNodeSpec needs every GPU of four 8-GPU nodes.
const fourNodeSpec = `
scheduling:
  train:  {worker_num: 32, num_cpus: 1, num_gpus: 1}
placement: {mode: auto, strategy: disaggregate}
`

// TestFirstPlanWaitsForInventory: a spec that comes while the inventory
// watch is behind the bucket (nodes stored before the spec, not yet
// delivered) gets its first revision planned on every node once the
// watch has caught up, not an invalid one on the nodes delivered so far;
// a watch that never catches up holds the first plan for at most
// inventoryCatchUpMax.
func TestFirstPlanWaitsForInventory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release bool
		want    plan.State
		// available is what the revision's error says of the GPUs (""
		// for none).
		available string
		nodes     int
	}{
		{"watch catches up", true, plan.StateValid, "", 4},
		{"watch never catches up", false, plan.StateInvalid, "available 8", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &skewClock{}
			h := newMemHarnessOn(t, clock)
			h.ttl = time.Hour
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h.node("n1")
			p := New(Config{NC: h.nc, JS: h.js, Debounce: 20 * time.Millisecond, Settle: -1, NoService: true,
				Clock: clock, LeaseTTL: time.Hour, StallAfter: time.Hour, Log: zerolog.Nop()})
			h.mem.onMem(p)
			lag := newLaggingInventory(p.inv)
			p.inv = lag
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			select {
			case <-lag.synced:
			case <-time.After(30 * time.Second):
				t.Fatal("the inventory watch never delivered the bucket's contents")
			}
			for i := 2; i <= 4; i++ {
				h.node(fmt.Sprintf("n%d", i))
			}
			if _, err := (memSpecs{h.mem.specs}).Put(ctx, "default", []byte(fourNodeSpec)); err != nil {
				t.Fatal(err)
			}
			natstest.WaitFor(t, 30*time.Second, "the planner to ask the bucket's last revision, or a revision", func() bool {
				select {
				case <-lag.asked:
					return true
				default:
				}
				sp, err := h.plans().Latest(ctx, "default")
				return err == nil && sp != nil
			})
			if sp, err := h.plans().Latest(ctx, "default"); err == nil && sp != nil {
				t.Fatalf("revision %d (%s) published before the inventory watch caught up", sp.Plan.Revision, sp.Plan.Status.State)
			}
			if tc.release {
				close(lag.release)
			} else {
				// Past the bound on the service's clock.
				natstest.WaitFor(t, 30*time.Second, "revision 1", clock.hurrying(time.Second, func() bool {
					sp, err := h.plans().Latest(ctx, "default")
					return err == nil && sp != nil
				}))
			}
			first := h.waitRevision(1)
			if first.Status.State != tc.want || !strings.Contains(first.Error, tc.available) {
				t.Errorf("revision 1 is %s (%q), want %s, %s", first.Status.State, first.Error, tc.want, tc.available)
			}
			nodes := map[string]bool{}
			for i := range first.Workers.Len() {
				nodes[first.Workers.At(i).NodeID] = true
			}
			if len(nodes) != tc.nodes {
				t.Errorf("revision 1 places workers on %d nodes, want %d", len(nodes), tc.nodes)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
