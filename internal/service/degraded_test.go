package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// place is where a worker runs: its node and GPUs.
func place(w plan.Worker) string { return fmt.Sprintf("%s %v", w.NodeID, w.GPUs) }

// TestNodeFlapMovesOnlyItsWorkers: one node of four, whose 8 GPUs a
// plan of all 32 uses, leaves (its key expires) and comes back. The
// revision after it left is degraded, not released: the 24 workers
// elsewhere stay where they were, the 8 are listed unplaced with where
// they ran; the revision after it returned puts exactly those 8 back on
// their GPUs, and nobody else moves. With buffers (one per node hosting
// train), the node's own buffer is unplaced with its train workers and
// returns with them, and every other buffer keeps its index and node
// throughout (numbered densely, the last would move to the gap and the
// returning node get a new index). Lookups answer for the placed
// workers throughout.
func TestNodeFlapMovesOnlyItsWorkers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, spec string
	}{
		{name: "train", spec: "scheduling:\n  train: {worker_num: 32, num_cpus: 1, num_gpus: 1}\n"},
		{name: "train and buffers", spec: "scheduling:\n  train: {worker_num: 32, num_cpus: 1, num_gpus: 1}\n  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			nodeFlap(t, c.spec)
		})
	}
}

// nodeFlap is TestNodeFlapMovesOnlyItsWorkers for spec, a plan of all
// 32 GPUs of four nodes.
func nodeFlap(t *testing.T, spec string) {
	h := newHarness(t)
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		h.node(id)
	}
	stop := h.planner(context.Background(), spec)
	defer stop()
	first := h.waitRevision(1)
	buffers := 0
	for _, w := range first.Workers.All() {
		if w.Component == plan.Buffer {
			buffers++
		}
	}
	if !first.Valid() || first.Workers.Len() != 32+buffers || strings.Contains(spec, "buffer") != (buffers == 4) {
		t.Fatalf("revision 1: valid %v, %d workers, %d buffers", first.Valid(), first.Workers.Len(), buffers)
	}
	before := map[string]string{}
	onN3 := 0
	for _, w := range first.Workers.All() {
		before[fmt.Sprint(w.Component, w.Index)] = place(*w)
		if w.NodeID == "n3" {
			onN3++
		}
	}

	h.kill("n3")
	second := h.waitRevision(2)
	if second.Valid() || second.PlanState() != plan.StateDegraded || len(second.Unplaced) != onN3 || second.Workers.Len() != first.Workers.Len()-onN3 {
		t.Fatalf("revision 2: valid %v, state %s, %d unplaced, %d placed; reason %q error %q",
			second.Valid(), second.PlanState(), len(second.Unplaced), second.Workers.Len(), second.Reason, second.Error)
	}
	for _, w := range second.Workers.All() {
		if got := place(*w); got != before[fmt.Sprint(w.Component, w.Index)] {
			t.Errorf("revision 2 moved %s %d from %s to %s", w.Component, w.Index, before[fmt.Sprint(w.Component, w.Index)], got)
		}
	}
	for _, u := range second.Unplaced {
		gpus := 1
		if u.Component == plan.Buffer {
			gpus = 0
		}
		if u.NodeID != "n3" || len(u.GPUs) != gpus {
			t.Errorf("unplaced %s %d: last place %s %v", u.Component, u.Index, u.NodeID, u.GPUs)
		}
	}
	// Lookups answer for the placed workers of a degraded plan.
	placed := second.Workers.At(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got client.PlacedWorker
	if err := bus.Request(ctx, h.nc, client.LookupSubject, wire.LookupRequest{Plan: "default", Component: string(placed.Component), Index: &placed.Index}, &got); err != nil || got.NodeID != placed.NodeID {
		t.Errorf("lookup of a placed worker in a degraded plan: %v %+v", err, got)
	}
	u := second.Unplaced[0]
	if err := bus.Request(ctx, h.nc, client.LookupSubject, wire.LookupRequest{Plan: "default", Component: string(u.Component), Index: &u.Index}, &got); err == nil ||
		!strings.Contains(err.Error(), "is unplaced: ") || !strings.Contains(err.Error(), "returns to node n3") {
		t.Errorf("lookup of an unplaced worker: %v", err)
	}

	h.node("n3")
	third := h.waitRevision(3)
	if !third.Valid() || third.PlanState() != plan.StateValid || len(third.Unplaced) != 0 || third.Moved != onN3 {
		t.Errorf("revision 3: valid %v, state %s, %d unplaced, moved %d; reason %q", third.Valid(), third.PlanState(), len(third.Unplaced), third.Moved, third.Reason)
	}
	var moved []string
	for _, w := range third.Workers.All() {
		if got := place(*w); got != before[fmt.Sprint(w.Component, w.Index)] {
			moved = append(moved, fmt.Sprintf("%s %d: %s -> %s", w.Component, w.Index, before[fmt.Sprint(w.Component, w.Index)], got))
		}
	}
	if len(moved) > 0 || third.Workers.Len() != first.Workers.Len() {
		t.Errorf("after n3 returned, workers are not where they were (%d of %d): %v", third.Workers.Len(), first.Workers.Len(), moved)
	}
	if fmt.Sprint(third.StorageToTrainWorkers) != fmt.Sprint(first.StorageToTrainWorkers) {
		t.Errorf("after n3 returned, buffers serve %v; they served %v", third.StorageToTrainWorkers, first.StorageToTrainWorkers)
	}
	// Nothing else was published in between: no release, no fresh plan.
	if hist := h.history(); len(hist) != 3 || slices.ContainsFunc(hist, func(p *planner.Plan) bool { return p.Workers.Len() == 0 }) {
		t.Errorf("history of %d revisions, one without workers?", len(hist))
	}
}

// TestForcedInfeasibleSpecKeepsPlacement: a spec stored that cannot be
// placed (as spec set --force stores it) releases nothing: the next
// revision keeps every worker where it was and says the spec is
// pending and why; a spec that fits again is planned on at once.
func TestForcedInfeasibleSpecKeepsPlacement(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
	ctx := context.Background()
	if _, err := specs.Put(ctx, "default", []byte("scheduling:\n  train: {worker_num: 64, num_cpus: 1, num_gpus: 1}\n")); err != nil {
		t.Fatal(err)
	}
	pending := h.waitFor("default", "the pending spec", func(p *planner.Plan) bool { return p.PendingSpec != nil })
	if !pending.Placed() || pending.Workers.Len() != first.Workers.Len() || pending.Moved != 0 ||
		!strings.Contains(pending.PendingSpec.Reason, "Insufficient GPUs") {
		t.Fatalf("after an infeasible spec: state %s, %d workers (had %d), moved %d, pending %+v",
			pending.PlanState(), pending.Workers.Len(), first.Workers.Len(), pending.Moved, pending.PendingSpec)
	}
	for _, w := range pending.Workers.All() {
		if o := first.Workers.Find(w.Component, w.Index); o == nil || place(*o) != place(*w) {
			t.Errorf("%s %d moved while the spec was pending", w.Component, w.Index)
		}
	}
	if _, err := specs.Put(ctx, "default", []byte("scheduling:\n  train: {worker_num: 24, num_cpus: 1, num_gpus: 1}\n")); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "the spec that fits", func(p *planner.Plan) bool {
		return p.Valid() && p.PendingSpec == nil && p.Workers.Len() == 24
	})
}

// TestValidateSaysWhatIsInTheWay: on a full cluster, validate says
// first whether the spec could fit the cluster at all, then which plans
// hold the room it lacks.
func TestValidateSaysWhatIsInTheWay(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.cluster(2, map[string]string{"default": "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct{ workers, want string }{
		{"8", "it would fit the cluster, but plans of its priority or higher hold the room it lacks: default (priority 0, 16 GPUs)"},
		{"64", "it cannot fit this cluster at all, whatever other plans hold: Insufficient GPUs: required 64.0, available 16"},
	} {
		var r client.ValidateReply
		body := []byte(`{"scheduling": {"train": {"worker_num": ` + c.workers + `, "num_cpus": 1, "num_gpus": 1}}}`)
		if err := bus.Request(ctx, h.nc, client.ValidateSubject, body, &r); err != nil {
			t.Fatal(err)
		}
		if r.Valid() || !strings.Contains(r.Error, c.want) {
			t.Errorf("%s workers: valid %v, error %q; want %q", c.workers, r.Valid(), r.Error, c.want)
		}
	}
}
