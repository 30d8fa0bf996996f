package service

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// secureServer starts an embedded server that requires credentials and
// returns how to connect to it as a role (node: the reporter's node).
func secureServer(t *testing.T) func(role auth.Role, node string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	dir := t.TempDir()
	a, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: dir, Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return func(role auth.Role, node string) (*nats.Conn, jetstream.JetStream) {
		creds, err := a.Creds(role, node, 0)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "user.creds")
		_ = os.WriteFile(path, creds, 0o600)
		nc, err := bus.Connect(url, string(role), zerolog.Nop(), bus.Security{Creds: path})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return nc, js
	}
}

// TestSecureService: on a server that requires credentials, each role
// does its part with its own: reporters put their nodes, the planner
// plans, a launcher looks up and follows its node, an admin changes the
// spec and the planner replans.
func TestSecureService(t *testing.T) {
	t.Parallel()
	connect := secureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pnc, pjs := connect(auth.Planner, "")
	p := New(Config{NC: pnc, JS: pjs, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, Log: zerolog.Nop()})
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for _, id := range []string{"n1", "n2", "n3"} {
		_, js := connect(auth.Reporter, id)
		invs := store.NewInventoryStore(js)
		invs.NoCreate = true
		// The planner makes the bucket; a reporter may not.
		natstest.WaitFor(t, 20*time.Second, "reporter "+id+" put its node", func() bool {
			_, err := invs.Put(ctx, id, simDoc(id), false, time.Minute)
			return err == nil
		})
	}

	lnc, _ := connect(auth.Launcher, "")
	c, _ := client.New(lnc)
	var w *client.PlacedWorker
	var err error
	natstest.WaitFor(t, 20*time.Second, "the launcher looking up train 0", func() bool {
		w, err = c.Lookup(ctx, "default", "train", 0)
		return w != nil
	})
	follow, err := c.FollowNode(ctx, "default", w.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-follow; got == nil || len(got.Workers) == 0 {
		t.Fatalf("launcher follows %s: %+v", w.NodeID, got)
	}

	before, err := c.Plan(ctx, "default", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, ajs := connect(auth.Admin, "")
	changed := "scheduling:\n  train: {worker_num: 12, num_cpus: 1, num_gpus: 1}\n"
	if _, err := store.NewSpecStore(ajs).Put(ctx, "default", []byte(changed)); err != nil {
		t.Fatalf("admin sets the spec: %v", err)
	}
	natstest.WaitFor(t, 20*time.Second, "a replan after the admin's spec", func() bool {
		r, err := c.Plan(ctx, "default", 0)
		// The admin's spec: 12 train workers, no eval.
		return err == nil && r.Document.Revision > before.Document.Revision &&
			r.Document.Workers.Find("train", 11) != nil && r.Document.Workers.Find("eval", 0) == nil
	})
}

// TestDrainNeedsAdmin: on a server that requires credentials the
// server itself refuses a launcher's or a reporter's write to the drain
// bucket (whatever client writes it), while an admin's drain is stored
// and the planner moves the workers off.
func TestDrainNeedsAdmin(t *testing.T) {
	t.Parallel()
	connectConn := secureServer(t)
	connect := func(role auth.Role, node string) jetstream.JetStream {
		_, js := connectConn(role, node)
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pnc, pjs := connectConn(auth.Planner, "")
	p := New(Config{NC: pnc, JS: pjs, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, Log: zerolog.Nop()})
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, id := range []string{"n1", "n2", "n3"} {
		invs := store.NewInventoryStore(connect(auth.Reporter, id))
		invs.NoCreate = true
		natstest.WaitFor(t, 20*time.Second, "reporter "+id+" put its node", func() bool {
			_, err := invs.Put(ctx, id, simDoc(id), false, time.Minute)
			return err == nil
		})
	}
	var first *planner.Plan
	natstest.WaitFor(t, 20*time.Second, "the first plan", func() bool {
		ps := p.Plans()
		if len(ps) == 1 && ps[0].Valid() {
			first = ps[0]
		}
		return first != nil
	})
	victim := first.Workers.Find(plan.Train, 0).NodeID
	d := store.Drain{NodeID: victim, Cause: plan.DrainOperator, By: "mallory@host", At: time.Now()}
	// A refused write is answered by nobody: each waits out its whole
	// timeout, so the two wait side by side.
	var wg sync.WaitGroup
	for _, role := range []auth.Role{auth.Launcher, auth.Reporter} {
		node := ""
		if role == auth.Reporter {
			node = victim
		}
		ds := store.NewDrainStore(connect(role, node))
		wg.Go(func() {
			wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
			defer wcancel()
			if err := ds.Put(wctx, d); err == nil {
				t.Errorf("a %s's drain was stored", role)
			}
		})
	}
	wg.Wait()
	if ds := p.Drains(); len(ds) != 0 {
		t.Fatalf("drains after the refused writes: %+v", ds)
	}
	d.By = "alice@host"
	if err := store.NewDrainStore(connect(auth.Admin, "")).Put(ctx, d); err != nil {
		t.Fatalf("an admin's drain: %v", err)
	}
	natstest.WaitFor(t, 20*time.Second, "the workers off the drained node", func() bool {
		ps := p.Plans()
		return len(ps) == 1 && ps[0].Revision > first.Revision && ps[0].Workers.Find(plan.Train, 0).NodeID != victim && !onNode(ps[0], victim)
	})
}
