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
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// laggingInventory is an inventory store whose watch, once hold is
// closed, holds every later event back until release is closed: a watch
// running behind the spec watch, as on a planner leading on another
// server than the one its nodes and spec were written through. synced
// is closed once the watch has delivered the bucket's contents; each
// LastRevision is told on asks.
type laggingInventory struct {
	inventoryStore
	synced, hold, release chan struct{}
	syncedOnce            *sync.Once
	asks                  chan struct{}
}

func newLaggingInventory(inner inventoryStore) laggingInventory {
	return laggingInventory{inventoryStore: inner, synced: make(chan struct{}), hold: make(chan struct{}),
		release: make(chan struct{}), syncedOnce: &sync.Once{}, asks: make(chan struct{}, 64)}
}

func (l laggingInventory) LastRevision(ctx context.Context) (uint64, error) {
	select {
	case l.asks <- struct{}{}:
	default:
	}
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
		for ev := range in {
			select {
			case <-l.hold:
				select {
				case <-l.release:
				case <-ctx.Done():
					return
				}
			default:
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
			if ev.Op == store.Synced {
				l.syncedOnce.Do(func() { close(l.synced) })
			}
		}
	}()
	return out, nil
}

// startLagging runs a planner on clock over a memory store with node n1
// reported, its inventory watch a laggingInventory's; done tells when
// it ends (after cancel).
func startLagging(t *testing.T, clock Clock) (*harness, laggingInventory, context.Context, context.CancelFunc, <-chan error) {
	t.Helper()
	h := newMemHarnessOn(t, clock)
	h.ttl = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	h.node("n1")
	p := New(Config{NC: h.nc, JS: h.js, Debounce: 20 * time.Millisecond, Settle: -1, NoService: true,
		Clock: clock, LeaseTTL: time.Hour, StallAfter: time.Hour, Log: zerolog.Nop()})
	h.mem.onMem(p)
	lag := newLaggingInventory(p.inv)
	p.inv = lag
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return h, lag, ctx, cancel, done
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
			h, lag, ctx, cancel, done := startLagging(t, clock)
			defer cancel()
			select {
			case <-lag.synced:
			case <-time.After(30 * time.Second):
				t.Fatal("the inventory watch never delivered the bucket's contents")
			}
			close(lag.hold)
			for i := 2; i <= 4; i++ {
				h.node(fmt.Sprintf("n%d", i))
			}
			if _, err := (memSpecs{h.mem.specs}).Put(ctx, "default", []byte(fourNodeSpec)); err != nil {
				t.Fatal(err)
			}
			waitAsked(t, lag, func() bool {
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

// waitAsked waits for the planner to ask the bucket's last revision, or
// for published (a revision out without asking: the test then fails on
// it).
func waitAsked(t *testing.T, lag laggingInventory, published func() bool) {
	t.Helper()
	natstest.WaitFor(t, 30*time.Second, "the planner to ask the bucket's last revision, or a revision", func() bool {
		select {
		case <-lag.asks:
			return true
		default:
		}
		return published()
	})
}

// TestLaterFirstPlanWaitsForInventory: a plan stored after another's
// first revision is out, while the watch is behind, waits as the first
// did (the first's ask is not reused) and is planned on every node once
// the watch catches up.
func TestLaterFirstPlanWaitsForInventory(t *testing.T) {
	h, lag, ctx, cancel, done := startLagging(t, &skewClock{})
	defer cancel()
	specs := memSpecs{h.mem.specs}
	if _, err := specs.Put(ctx, "a", []byte("scheduling:\n  train: {worker_num: 1, num_cpus: 1, num_gpus: 1}\n")); err != nil {
		t.Fatal(err)
	}
	latest := func(name string) *planner.Plan {
		sp, err := h.plans().Latest(ctx, name)
		if err != nil || sp == nil {
			return nil
		}
		return sp.Plan
	}
	natstest.WaitFor(t, 30*time.Second, "plan a's revision 1", func() bool { return latest("a") != nil })
	for len(lag.asks) > 0 {
		<-lag.asks
	}
	close(lag.hold)
	for i := 2; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	if _, err := specs.Put(ctx, "b", []byte(fourNodeSpec)); err != nil {
		t.Fatal(err)
	}
	waitAsked(t, lag, func() bool { return latest("b") != nil })
	if b := latest("b"); b != nil {
		t.Fatalf("plan b's revision %d (%s, %q) published while the inventory watch was behind", b.Revision, b.Status.State, b.Error)
	}
	close(lag.release)
	var b *planner.Plan
	natstest.WaitFor(t, 30*time.Second, "plan b's revision 1", func() bool { b = latest("b"); return b != nil })
	// b needs all 32 GPUs and a holds one: planned on every node it
	// waits for 31, on n1 alone for 7.
	if !strings.Contains(b.Error, "available 31") {
		t.Errorf("plan b's revision %d: %s %q, want it planned on all four nodes (available 31)", b.Revision, b.Status.State, b.Error)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
