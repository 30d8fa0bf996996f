package service

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// flipSpecByte flips one byte of plan name's newest spec record in the
// spec bucket's block files under the stopped server's store dir.
func flipSpecByte(t *testing.T, dir, name string) {
	t.Helper()
	blocks, _ := filepath.Glob(filepath.Join(dir, "*", "streams", "KV_"+client.SpecBucket, "msgs", "*.blk"))
	subject := []byte("$KV." + client.SpecBucket + "." + name)
	for _, b := range blocks {
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.LastIndex(data, subject)
		if i < 0 {
			continue
		}
		j := bytes.Index(data[i:], []byte("worker_num"))
		if j < 0 {
			t.Fatalf("no spec after %s in %s", subject, b)
		}
		data[i+j] ^= 0x20 // worker_num -> Worker_num
		if err := os.WriteFile(b, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no record of %s in %v", subject, blocks)
}

// TestSpecRecordDamaged: a byte of plan default's spec record flips in
// the spec bucket's block across a server restart, while the planner
// runs; the bucket's other plan is whole. The server lists the record
// but cannot read it (a get says "not found", as for a spec never
// stored). The leader says so, naming the plan, in its lease's problems
// (planner status's PROBLEM lines); the plan keeps its placement, not
// released as if removed; the other plan has no problem. A planner then
// started with --spec refuses to store it over the damaged record; one
// started without plans on, naming the damage and holding the plan's
// placement.
func TestSpecRecordDamaged(t *testing.T) {
	t.Parallel()
	// A 2 s store deadline: a spec watch held back by the damage is
	// noticed at the first guard round after it has waited that long (5 s
	// by default).
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, StoreTimeout: 2 * time.Second,
		guardRound: quickGuard}
	r := newRide(t, 4, cfg)
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	ctx := context.Background()
	if _, err := store.NewSpecStore(r.js).Put(ctx, "other", []byte("scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1}}\n")); err != nil {
		t.Fatal(err)
	}
	plans := store.NewPlanStore(r.js)
	natstest.WaitFor(t, 10*time.Second, "plan other placed", func() bool {
		sp, err := plans.Latest(ctx, "other")
		return err == nil && sp != nil && sp.Plan.Valid()
	})

	dir := r.srv.NATS().StoreDir()
	r.srv.Stop()
	flipSpecByte(t, dir, "default")
	r.srv.Start()
	natstest.WaitFor(t, 10*time.Second, "the damaged spec read, as not found", func() bool {
		_, _, err := store.NewSpecStore(r.js).Get(ctx, "default")
		if err == nil {
			t.Fatal("the damaged spec reads")
		}
		return errors.Is(err, client.ErrNotFound) // else the test's connection is not back yet
	})

	const said = "plan default: its spec record in bucket " + client.SpecBucket + " cannot be read"
	var problems []string
	natstest.WaitFor(t, 20*time.Second, "the lease naming plan default's damaged spec", func() bool {
		l, err := plans.ReadLease(ctx, "default")
		if err != nil || l == nil {
			return false
		}
		problems = l.Problems
		return slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, said) })
	})
	if slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "plan other") }) {
		t.Errorf("plan other, whole, has a problem: %q", problems)
	}
	// Nothing released: the latest still places the first placement.
	if sp, err := plans.Latest(ctx, "default"); err != nil || sp.Plan.Removed() || !planner.SamePlacement(first, sp.Plan) {
		t.Fatalf("after the damage: %v, revision %+v", err, sp.Plan.Status)
	}

	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	nc, js := rideConn(t, r.srv.URL())
	cfg.NC, cfg.JS, cfg.Log, cfg.NoService = nc, js, zerolog.Nop(), true
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := New(cfg).Run(rctx)
	if !errors.Is(err, errSpecLost) || !strings.Contains(err.Error(), "plan default") || !strings.Contains(err.Error(), "cannot read it") {
		t.Fatalf("serve --spec over the damaged record: %v", err)
	}
	if _, _, err := store.NewSpecStore(js).Get(ctx, "default"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("--spec stored over the damaged record: %v", err)
	}

	// Restarted without --spec, on the damage: its spec watch never says
	// it delivered the bucket (the server counts the record it cannot
	// read), yet the planner plans: it names the plan, plan default
	// keeps its placement, and a new spec is planned.
	cfg.Spec, cfg.Log = nil, zerolog.New(&r.logs)
	rctx, cancel = context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	natstest.WaitFor(t, 20*time.Second, "the restarted planner's lease naming plan default's damaged spec", func() bool {
		l, err := plans.ReadLease(ctx, "default")
		return err == nil && l != nil && slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, said) }) &&
			!slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, "no plan is made") })
	})
	if _, err := store.NewSpecStore(js).Put(ctx, "third", []byte("scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1}}\n")); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "plan third placed", func() bool {
		sp, err := plans.Latest(ctx, "third")
		return err == nil && sp != nil && sp.Plan.Valid()
	})
	if sp, err := plans.Latest(ctx, "default"); err != nil || sp.Plan.Removed() || !planner.SamePlacement(first, sp.Plan) {
		t.Fatalf("after the restart on the damage: %v, revision %+v", err, sp.Plan.Status)
	}
	// spec rm removes the damaged spec: the plan is released, and its
	// problem ends.
	if err := store.NewSpecStore(js).Delete(ctx, "default"); err != nil {
		t.Fatalf("spec rm of the damaged spec: %v", err)
	}
	natstest.WaitFor(t, 10*time.Second, "plan default removed, its problem gone", func() bool {
		sp, err := plans.Latest(ctx, "default")
		l, lerr := plans.ReadLease(ctx, "default")
		return err == nil && sp != nil && sp.Plan.Removed() && lerr == nil && l != nil &&
			!slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, "plan default") })
	})
}
