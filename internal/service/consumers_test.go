package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestLauncherCannotBlindPlanner: a launcher that makes 1,100 consumers
// on each stream it may read and on those the planner plans from, and
// races a planner restart for the slot the old planner's watch frees,
// leaves the new planner seeing a new node and placing workers on it.
// Without the clients' ban on consumers of the inventory (auth's
// plannerOnlyConsumers) the launcher fills the inventory stream's 1,000
// slots and the new planner never watches it; without it on the drain
// bucket's stream, the new planner never reads the drains, and never
// replans; with the planner's check of the assignments through a
// consumer, it never replans either.
func TestLauncherCannotBlindPlanner(t *testing.T) {
	t.Parallel()
	connect := secureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func() (*Service, func()) {
		pnc, pjs := connect(auth.Planner, "")
		p := New(Config{NC: pnc, JS: pjs, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, Log: zerolog.Nop()})
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(pctx) }()
		return p, func() { stop(); <-done; pnc.Close() }
	}
	put := func(id string) {
		_, js := connect(auth.Reporter, id)
		invs := store.NewInventoryStore(js)
		invs.NoCreate = true
		natstest.WaitFor(t, 20*time.Second, "reporter "+id+" put its node", func() bool {
			_, err := invs.Put(ctx, id, simDoc(id), false, time.Minute)
			return err == nil
		})
	}
	sees := func(p *Service, id string) func() bool {
		return func() bool {
			return slices.ContainsFunc(p.Inventory(), func(n inventory.NodeInventory) bool { return n.NodeID == id })
		}
	}

	p, stop := start()
	put("n1")
	natstest.WaitFor(t, 20*time.Second, "the planner sees n1", sees(p, "n1"))

	_, ljs := connect(auth.Launcher, "")
	streams := []string{bus.InventoryStream, "KV_" + client.SpecBucket, "KV_" + client.DrainBucket, client.AssignmentsStream, client.PlansStream}
	const banned = 3 // streams[:banned] are the planner's alone
	// The launcher makes 1,100 consumers on each: the cap stops it at
	// 1,000 where it may read. A refused request is answered by nobody
	// (it takes its whole timeout, and costs the server nothing), so
	// 50 goroutines try the planner's streams at once; one a stream
	// makes them where it may (each a JetStream API call, which a
	// flood would queue past its timeout). made[i][g]: made on
	// streams[i] by goroutine g, which alone writes it.
	const workers = 50
	made := make([][workers]int, len(streams))
	var wg sync.WaitGroup
	for i, st := range streams {
		n, timeout := workers, 200*time.Millisecond
		if i >= banned {
			n, timeout = 1, 5*time.Second
		}
		for g := range n {
			wg.Go(func() {
				for k := g; k < 1100; k += n {
					cctx, ccancel := context.WithTimeout(ctx, timeout)
					// In memory: the cap and the permissions count them
					// as any, and the server makes (and, at shutdown,
					// closes) a file-backed one's store for each: some
					// 30 s for the thousands.
					cfg := jetstream.ConsumerConfig{Durable: fmt.Sprintf("squat-%d", k), MemoryStorage: true}
					if _, err := ljs.CreateConsumer(cctx, st, cfg); err == nil {
						made[i][g]++
					}
					ccancel()
				}
			})
		}
	}
	wg.Wait()
	total := func(i int) (n int) {
		for _, m := range made[i] {
			n += m
		}
		return n
	}
	for i, st := range streams[:banned] {
		if n := total(i); n != 0 {
			t.Errorf("the launcher made %d consumers on %s, want none", n, st)
		}
	}
	// Where a launcher may read, its consumers are bounded by the cap.
	for i, st := range streams[banned:] {
		if got := total(banned + i); got == 0 || got > 1000 {
			t.Errorf("the launcher made %d consumers on %s, want 1..1000", got, st)
		}
	}

	// The restart frees the old watch's slot; the launcher races for it.
	rctx, rcancel := context.WithCancel(ctx)
	racing := make(chan struct{})
	go func() {
		defer close(racing)
		for i := 2000; rctx.Err() == nil; i++ {
			for _, st := range streams[:banned] {
				cctx, ccancel := context.WithTimeout(rctx, 200*time.Millisecond)
				_, _ = ljs.CreateConsumer(cctx, st, jetstream.ConsumerConfig{Durable: fmt.Sprintf("race-%d", i)})
				ccancel()
			}
		}
	}()
	stop()
	p, stop = start()
	defer stop()
	put("n2")
	natstest.WaitFor(t, 30*time.Second, "the restarted planner sees n2", sees(p, "n2"))
	lnc, _ := connect(auth.Launcher, "")
	lc, _ := client.New(lnc)
	natstest.WaitFor(t, 30*time.Second, "a revision placing workers on n2", func() bool {
		r, err := lc.Plan(ctx, "default", 0)
		if err != nil {
			return false
		}
		for _, w := range r.Document.Workers.All() {
			if w.NodeID == "n2" {
				return true
			}
		}
		return false
	})
	rcancel()
	<-racing
	for _, pr := range p.Health().Problems {
		if strings.Contains(pr, "cannot watch") {
			t.Errorf("problem %q", pr)
		}
	}
}

// TestWatchAtCapIsProblem: a planner that cannot make its inventory or
// drain watch (the stream's consumers at their cap) says so in Health
// (the lease carries it to planner status) and
// poolplanner_watch_failing; once a slot is free it watches, and both
// clear.
func TestWatchAtCapIsProblem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		watch, stream, problem string
	}{
		{"inventory", bus.InventoryStream, "cannot watch the inventory"},
		{"drains", "KV_" + client.DrainBucket, "cannot watch the drains"},
	} {
		t.Run(c.watch, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()
			h.node("n1")
			if _, err := store.NewDrainStore(h.js).Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			h.drain("n1", new(2), "", nil)
			// The server's default cap (the stream sets none): the
			// planner's own account holds every slot.
			// In memory: the cap counts them all the same, and a file-backed
			// one costs the server a file to make (seconds for the thousand).
			for i := range 1000 {
				if _, err := h.js.CreateConsumer(ctx, c.stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("hog-%d", i), MemoryStorage: true}); err != nil {
					t.Fatal(err)
				}
			}
			reg := prometheus.NewRegistry()
			p := New(Config{NC: h.nc, JS: h.js, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, Log: zerolog.Nop(),
				Metrics: metrics.NewPlanner(reg)})
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = p.Run(pctx) }()
			defer func() { cancel(); <-done }()

			failing := `poolplanner_watch_failing{watch="` + c.watch + `"}`
			capped := func() bool {
				return slices.ContainsFunc(p.Health().Problems, func(s string) bool {
					return strings.Contains(s, c.problem) && strings.Contains(s, "cap")
				})
			}
			natstest.WaitFor(t, 20*time.Second, "the problem said", capped)
			waitScraped(t, reg, failing+" = 1", func(m map[string]float64) bool { return m[failing] == 1 })
			if m := scraped(t, reg); m[`poolplanner_watch_failures_total{watch="`+c.watch+`"}`] < 1 {
				t.Errorf("poolplanner_watch_failures_total not counted: %v", m)
			}

			if err := h.js.DeleteConsumer(ctx, c.stream, "hog-0"); err != nil {
				t.Fatal(err)
			}
			natstest.WaitFor(t, 30*time.Second, "the planner watching", func() bool {
				ds := p.Drains()
				return !capped() && slices.ContainsFunc(p.Inventory(), func(n inventory.NodeInventory) bool { return n.NodeID == "n1" }) &&
					len(ds) == 1 && ds[0].Target() == "n1:2"
			})
			waitScraped(t, reg, failing+" = 0", func(m map[string]float64) bool { return m[failing] == 0 })
		})
	}
}
