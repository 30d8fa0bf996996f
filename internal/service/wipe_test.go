package service

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// TestWipeResumesFromMemory: a planner with no state file places 4
// nodes' workers, replans a node's loss and keeps the node's return (a
// placement a fresh plan does not make); the server's store is wiped
// while the planner runs. The planner, which holds the plan in memory,
// publishes nothing before the nodes reported again, and then that
// very placement, whole, as the next revision: no empty revision, no
// fresh plan moving everyone.
func TestWipeResumesFromMemory(t *testing.T) {
	t.Parallel()
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 20 * time.Second, LeaseTTL: time.Second}
	r := newRide(t, 4, cfg)
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	gone := first.Workers.At(0).NodeID
	r.crashReporter(gone)
	last := r.waitPlan(20*time.Second, "revision 2", func(p *planner.Plan) bool { return p.Revision >= 2 && !onNode(p, gone) })
	r.reporter(gone) // back: a node joining moves nobody
	natstest.WaitFor(t, 10*time.Second, gone+" back in the planner's view", func() bool { return len(r.p.view().nodes) == 4 })
	spec, err := planner.ParseSpec([]byte(testSpec))
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := planner.Compute(spec, r.p.view().nodes)
	if err != nil || planner.SamePlacement(fresh, last) {
		t.Fatalf("the test needs a placement a fresh plan does not make: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.p.Idle(ctx); err != nil {
		t.Fatal(err)
	}

	r.srv.Wipe()
	next := r.waitPlan(30*time.Second, "after the wipe", revisionAtLeast(1))
	if next.Revision != last.Revision+1 || !next.Valid() || !planner.SamePlacement(last, next) || !strings.Contains(next.Reason, "history was lost") {
		t.Fatalf("after the wipe: revision %d (want %d), valid %v, same placement %v, reason %q",
			next.Revision, last.Revision+1, next.Valid(), planner.SamePlacement(last, next), next.Reason)
	}
	settled(t, r, last)
	select {
	case err := <-r.done:
		t.Fatalf("the planner stopped: %v", err)
	default:
	}
}

// TestWipeLostPlacementSaid: a planner restarted on a wiped store whose
// state file keeps no placement of the plan's last revision (a plan
// over the bound is not kept; here the file is gone) cannot resume the
// placement: it says so, a problem naming the plan and the revision
// lost, waits out Settle for the reporters to put their keys again (it
// cannot know which nodes it was on), then plans afresh above the mark,
// inventing nothing: no revision on the emptied inventory.
func TestWipeLostPlacementSaid(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "revisions.json")
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: 2 * time.Second, LeaseTTL: time.Second, StateFile: state}
	r := newRide(t, 4, cfg)
	last := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	// The planner keeps a revision once its publish is acknowledged,
	// which can be after the stream shows it to the test: stopped in
	// between, it kept nothing, and there is nothing to lose.
	kept := newMarks(state).placementPath("default")
	natstest.WaitFor(t, 10*time.Second, "revision 1's placement kept", func() bool {
		_, err := os.Stat(kept)
		return err == nil
	})
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("no placement kept to lose: %v", err)
	}
	if err := os.Remove(kept); err != nil {
		t.Fatal(err)
	}
	r.srv.Wipe()

	nc, js := rideConn(t, r.srv.URL())
	cfg.NC, cfg.JS, cfg.Log = nc, js, zerolog.New(&r.logs)
	p := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	natstest.WaitFor(t, 20*time.Second, "a problem naming the plan and its lost placement", func() bool {
		return slices.ContainsFunc(p.Health().Problems, func(s string) bool {
			return strings.HasPrefix(s, "plan default: its placement of revision 1 was lost") && strings.Contains(s, "planned afresh")
		})
	})
	next := r.waitPlan(30*time.Second, "a revision after the wipe", func(p *planner.Plan) bool { return p.Revision >= 2 && p.Valid() })
	if next.Revision != last.Revision+1 || !strings.Contains(next.Reason, "history was lost") {
		t.Errorf("after the wipe: revision %d (want %d), reason %q", next.Revision, last.Revision+1, next.Reason)
	}
}
