package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// drainSpec is a 24-GPU plan on 4x8xH100: train packs the first nodes.
const drainSpec = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: 2, num_cpus: 1, num_gpus: 4}\n"

// places is every worker's place, by component and index.
func places(p *planner.Plan) map[string]string {
	out := map[string]string{}
	for _, w := range p.Workers.All() {
		out[fmt.Sprint(w.Component, w.Index)] = place(*w)
	}
	return out
}

// now is the time of the harness's store: its clock's, in memory.
func (h *harness) now() time.Time {
	if h.mem != nil {
		return h.mem.clock.Now()
	}
	return time.Now()
}

// drain stores an operator's drain of node (gpu nil) or its GPU.
func (h *harness) drain(node string, gpu *int, reason string, deadline *time.Time) {
	h.t.Helper()
	d := store.Drain{NodeID: node, GPU: gpu, Cause: plan.DrainOperator, Reason: reason, Deadline: deadline, By: "test@host", At: h.now().UTC()}
	put := store.NewDrainStore(h.js).Put
	if h.mem != nil {
		put = memDrains{h.mem.drains}.Put
	}
	if err := put(context.Background(), d); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) undrain(node string, gpu *int) {
	h.t.Helper()
	undrain := func() error {
		return store.NewDrainStore(h.js).Undrain(context.Background(), node, gpu, "test@host", "", h.now())
	}
	if h.mem != nil {
		undrain = func() error { return memDrains{h.mem.drains}.undrain(node, gpu, "test@host", h.now()) }
	}
	if err := undrain(); err != nil {
		h.t.Fatal(err)
	}
}

// checkOnlyMoved fails when a worker of next is not where prev had it,
// unless lost names it (moved: it must not be where it was).
func checkOnlyMoved(t *testing.T, prev, next *planner.Plan, lost map[string]bool) {
	t.Helper()
	was := places(prev)
	for k, at := range places(next) {
		switch {
		case lost[k] && at == was[k]:
			t.Errorf("%s stayed at %s", k, at)
		case !lost[k] && at != was[k]:
			t.Errorf("%s moved from %s to %s", k, was[k], at)
		}
	}
}

// TestDrainNode: draining the node of train 0 moves its workers off in
// one revision, valid (there is room), nobody else moving, its status
// naming the drain and its reason saying it; the gauge counts the
// node's GPUs. The drain holds when the leader dies and a standby takes
// over, and when that planner restarts: new workers of a spec change
// never land on the drained node.
func TestDrainNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	url := h.url()
	cfg := Config{Spec: []byte(drainSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	a := h.instance(url, cfg)
	first := h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	b := h.instance(url, cfg)
	victim := first.Workers.Find(plan.Train, 0).NodeID
	lost := map[string]bool{}
	for _, w := range first.Workers.All() {
		if w.NodeID == victim {
			lost[fmt.Sprint(w.Component, w.Index)] = true
		}
	}

	drainedAt := time.Now()
	h.drain(victim, nil, "driver upgrade", nil)
	next := h.waitFor("default", "off the drained node", func(p *planner.Plan) bool { return !onNode(p, victim) })
	t.Logf("drained %s: its %d workers off in %s", victim, len(lost), time.Since(drainedAt).Round(time.Millisecond))
	if !next.Valid() || next.Revision != first.Revision+1 {
		t.Fatalf("revision %d after the drain: valid %v, error %q (revision %d before)", next.Revision, next.Valid(), next.Error, first.Revision)
	}
	checkOnlyMoved(t, first, next, lost)
	st := next.Status
	if len(st.Drained) != 1 || st.Drained[0].NodeID != victim || st.Drained[0].GPU != nil || st.Drained[0].Reason != "driver upgrade" ||
		st.Drained[0].Cause != plan.DrainOperator {
		t.Errorf("status drained %+v, want %s (driver upgrade)", st.Drained, victim)
	}
	if want := "drained " + victim + " (driver upgrade)"; !strings.Contains(next.Reason, want) {
		t.Errorf("reason %q does not say %q", next.Reason, want)
	}
	leader := h.waitLeader(5*time.Second, a, b)
	waitScraped(t, leader.reg, "the drained gauge", func(m map[string]float64) bool {
		return m[`poolplanner_drained_gpus{cause="operator"}`] == 8
	})

	// Failover: the standby holds the drain.
	standby := b
	if leader == b {
		standby = a
	}
	leader.crash()
	h.waitLeader(5*time.Second, standby)
	specs := store.NewSpecStore(h.js)
	// Eval's needs change: its workers are placed anew, all 24 GPUs
	// left in use again.
	reshaped := "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: 4, num_cpus: 1, num_gpus: 2}\n"
	if _, err := specs.Put(context.Background(), "default", []byte(reshaped)); err != nil {
		t.Fatal(err)
	}
	after := h.waitFor("default", "the new spec after the failover", func(p *planner.Plan) bool { return p.Workers.Len() == 20 })
	if !after.Valid() || onNode(after, victim) {
		t.Errorf("after the failover: valid %v, on the drained node %v (error %q)", after.Valid(), onNode(after, victim), after.Error)
	}
	checkOnlyMoved(t, next, after, map[string]bool{"eval0": true, "eval1": true, "eval2": true, "eval3": true})

	// Restart: a planner that starts on the stored state holds it too.
	standby.stop()
	c := h.instance(url, cfg)
	h.waitLeader(5*time.Second, c)
	if _, err := specs.Put(context.Background(), "default", []byte(drainSpec)); err != nil {
		t.Fatal(err)
	}
	again := h.waitFor("default", "the spec back after the restart", func(p *planner.Plan) bool { return p.Workers.Len() == 18 })
	if !again.Valid() || onNode(again, victim) {
		t.Errorf("after the restart: valid %v, on the drained node %v", again.Valid(), onNode(again, victim))
	}
	if ds := c.p.Drains(); len(ds) != 1 || ds[0].Target() != victim || ds[0].By != "test@host" {
		t.Errorf("drains after the restart: %+v", ds)
	}
}

// TestDrainGPU: draining one GPU moves only its worker; undraining it
// moves nobody (no new revision).
func TestDrainGPU(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.cluster(4, map[string]string{"default": drainSpec})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	first := h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	w := first.Workers.Find(plan.Train, 0)
	gpu := w.GPUs[0]
	h.drain(w.NodeID, &gpu, "", nil)
	next := h.waitFor("default", "train 0 off its GPU", func(p *planner.Plan) bool {
		return place(*p.Workers.Find(plan.Train, 0)) != place(*w)
	})
	if !next.Valid() || next.Moved != 1 {
		t.Errorf("after the GPU drain: valid %v, moved %d", next.Valid(), next.Moved)
	}
	checkOnlyMoved(t, first, next, map[string]bool{"train0": true})
	target := fmt.Sprintf("%s:%d", w.NodeID, gpu)
	if st := next.Status; len(st.Drained) != 1 || st.Drained[0].Target() != target {
		t.Errorf("status drained %+v, want %s", st.Drained, target)
	}
	if !strings.Contains(next.Reason, "drained "+target) {
		t.Errorf("reason %q does not say drained %s", next.Reason, target)
	}

	// The drain's replan counted, else the undrain's wait below could
	// end on it (a revision is in the stream a moment before its replan
	// is counted).
	done := h.waitPublished("default", 2)
	h.undrain(w.NodeID, &gpu)
	h.waitReplans("default", done+1)
	sp, err := store.NewPlanStore(h.js).Latest(context.Background(), "default")
	if err != nil || sp.Plan.Revision != next.Revision {
		t.Fatalf("undrain published revision %d (had %d): %v", sp.Plan.Revision, next.Revision, err)
	}
}

// TestDrainNoRoom: with one node of four drained (its workers moved to
// the free GPUs), draining a second leaves no room for the 24 GPUs: the
// plan degrades as for a lost node, its unplaced workers and its status
// saying the drain is why; undraining it puts the unplaced back where
// they ran, moving nobody else.
func TestDrainNoRoom(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	h.cluster(4, map[string]string{"default": drainSpec})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	h.drain("n1", nil, "rack power", nil)
	first := h.waitFor("default", "off n1", func(p *planner.Plan) bool { return p.Valid() && !onNode(p, "n1") })
	h.drain("n2", nil, "rack power", nil)
	deg := h.waitFor("default", "degraded by the drains", func(p *planner.Plan) bool {
		return p.PlanState() == plan.StateDegraded && !onNode(p, "n2")
	})
	st := deg.Status
	if st.Reason != plan.ReasonDrained || len(st.Drained) == 0 {
		t.Errorf("degraded status %+v, want reason %s naming the drains", st, plan.ReasonDrained)
	}
	for _, u := range deg.Unplaced {
		if !strings.HasPrefix(u.Reason, planner.WhyDrained+" n") {
			t.Errorf("unplaced %s %d: reason %q", u.Component, u.Index, u.Reason)
		}
	}
	checkOnlyMoved(t, first, deg, nil)
	h.undrain("n2", nil)
	back := h.waitFor("default", "whole again", func(p *planner.Plan) bool { return p.Valid() })
	checkOnlyMoved(t, first, back, map[string]bool{})
}

// TestDrainDeadline: a drain with a deadline moves nobody before it:
// the revision says the workers are leaving, and when it passes they
// leave.
func TestDrainDeadline(t *testing.T) {
	t.Parallel()
	// The deadline passes when the test moves the clock past it, not
	// seconds later: the nodes' keys outlast the jump, and so does the
	// loop's pulse.
	clock := &skewClock{}
	h := newMemHarnessOn(t, clock)
	h.ttl = time.Minute
	h.cluster(4, map[string]string{"default": drainSpec})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1, StallAfter: time.Minute})
	defer stop()
	first := h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	victim := first.Workers.Find(plan.Train, 0).NodeID
	deadline := clock.Now().Add(3 * time.Second).UTC().Truncate(time.Second)
	h.drain(victim, nil, "maintenance", &deadline)
	leaving := h.waitFor("default", "saying they are leaving", func(p *planner.Plan) bool { return len(p.Status.Leaving) > 0 })
	if clock.Now().Before(deadline) {
		checkOnlyMoved(t, first, leaving, map[string]bool{})
	}
	if !strings.Contains(leaving.Reason, victim+" draining: its workers leave at "+deadline.Format(time.RFC3339)) {
		t.Errorf("reason %q does not say they leave at the deadline", leaving.Reason)
	}
	clock.advance(deadline.Sub(clock.Now()) + time.Millisecond)
	gone := h.waitFor("default", "off the node after the deadline", func(p *planner.Plan) bool { return !onNode(p, victim) })
	if clock.Now().Before(deadline) {
		t.Errorf("the workers left before the deadline")
	}
	if !gone.Valid() || len(gone.Status.Leaving) != 0 || len(gone.Status.Drained) != 1 {
		t.Errorf("after the deadline: valid %v, status %+v", gone.Valid(), gone.Status)
	}
}

// TestDrainWatchAfterLostBucket: the drain bucket deleted by hand is
// made again by the guard, with the drains the planner knew; a drain
// stored after that is seen at once, though its sequence in the new
// stream is one the old watch had passed (restartWatches makes the
// drain watch again; the old one would resume past it).
func TestDrainWatchAfterLostBucket(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	in := h.instance(h.url(), Config{Spec: []byte(drainSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, guardRound: quickGuard})
	h.waitFor("default", "placing 24 GPUs", func(p *planner.Plan) bool { return p.Valid() })
	sees := func(targets ...string) func() bool {
		return func() bool {
			var got []string
			for _, d := range in.p.Drains() {
				got = append(got, d.Target())
			}
			return slices.Equal(got, targets)
		}
	}
	// Many changes, so that the old watch's sequence is well past
	// what the bucket made again holds.
	for range 5 {
		h.drain("n4", nil, "", nil)
		h.undrain("n4", nil)
	}
	h.drain("n1", new(0), "kept", nil)
	natstest.WaitFor(t, 10*time.Second, "the planner sees n1:0 drained", sees("n1:0"))

	ctx := context.Background()
	if err := h.js.DeleteKeyValue(ctx, client.DrainBucket); err != nil {
		t.Fatal(err)
	}
	ds := store.NewDrainStore(h.js)
	ds.NoCreate = true
	natstest.WaitFor(t, 20*time.Second, "the guard restores the drain bucket", func() bool {
		got, _, err := ds.List(ctx)
		return err == nil && len(got) == 1 && got[0].Target() == "n1:0"
	})
	h.drain("n2", new(1), "after the loss", nil)
	natstest.WaitFor(t, 10*time.Second, "the planner sees the drain stored after the loss", sees("n1:0", "n2:1"))
	h.undrain("n1", new(0))
	natstest.WaitFor(t, 10*time.Second, "the planner sees the undrain", sees("n2:1"))
}
