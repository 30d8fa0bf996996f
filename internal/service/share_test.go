package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// shareSpec asks for train workers of one GPU.
func shareSpec(workers, priority int) string {
	return fmt.Sprintf("priority: %d\nscheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", priority, workers)
}

// specWriter writes specs as an operator does (planner spec set, rm).
type specWriter interface {
	Put(ctx context.Context, name string, spec []byte) (uint64, error)
	Delete(ctx context.Context, name string) error
}

// cluster starts simulated nodes n1..nN and stores specs (plan name →
// spec); it returns the spec store (a *store.SpecStore on NATS).
func (h *harness) cluster(n int, specs map[string]string) specWriter {
	h.t.Helper()
	for i := 1; i <= n; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	var ss specWriter = store.NewSpecStore(h.js)
	if h.mem != nil {
		ss = memSpecs{h.mem.specs}
	}
	for name, spec := range specs {
		if _, err := ss.Put(context.Background(), name, []byte(spec)); err != nil {
			h.t.Fatal(err)
		}
	}
	return ss
}

// waitFor waits for plan name's latest revision to satisfy ok.
func (h *harness) waitFor(name string, what string, ok func(*planner.Plan) bool) *planner.Plan {
	h.t.Helper()
	plans := h.plans()
	var last *planner.Plan
	waited := false
	defer func() { // also as WaitFor fails the test
		if !waited && last != nil {
			h.t.Logf("plan %s: last revision seen %d valid %v error %q reason %q", name, last.Revision, last.Valid(), last.Error, last.Reason)
		}
	}()
	natstest.WaitFor(h.t, 15*time.Second, fmt.Sprintf("plan %s: a revision %s", name, what), func() bool {
		sp, err := plans.Latest(context.Background(), name)
		if err != nil || sp == nil {
			return false
		}
		last = sp.Plan
		return ok(last)
	})
	waited = true
	return last
}

// checkShared fails when a GPU is in two plans' latest revisions.
func (h *harness) checkShared(plans ...*planner.Plan) {
	h.t.Helper()
	owner := map[string]string{}
	for _, p := range plans {
		for _, w := range p.Workers.All() {
			for _, g := range w.GPUs {
				k := fmt.Sprintf("%s:%d", w.NodeID, g)
				if o, ok := owner[k]; ok && o != p.Name {
					h.t.Fatalf("GPU %s in plans %s and %s", k, o, p.Name)
				}
				owner[k] = p.Name
			}
		}
	}
}

// TestSeveralPlans: two plans share four nodes; a third of higher
// priority arrives and the lowest gives way with a published reason; it
// is removed and the one that gave way comes back, in a new revision.
// Lookups, assignments and validation answer per plan.
func TestSeveralPlans(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ { // 32 GPUs
		h.node(fmt.Sprintf("n%d", i))
	}
	specs := store.NewSpecStore(h.js)
	put := func(name, spec string) {
		t.Helper()
		if _, err := specs.Put(ctx, name, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	put("keep", shareSpec(12, 5))
	put("low", shareSpec(12, 0))
	stop := h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	valid := func(p *planner.Plan) bool { return p.Valid() }
	keep := h.waitFor("keep", "valid", valid)
	low := h.waitFor("low", "valid", valid)
	h.checkShared(keep, low)
	if keep.GPUsHeld != 12 || keep.Priority != 5 || low.GPUsHeld != 12 {
		t.Fatalf("keep holds %d (priority %d), low %d", keep.GPUsHeld, keep.Priority, low.GPUsHeld)
	}

	// big (priority 10) needs 16: 8 are free, low gives way; keep, of
	// higher priority than low, stays where it is.
	put("big", shareSpec(16, 10))
	big := h.waitFor("big", "valid", valid)
	gave := h.waitFor("low", "invalid", func(p *planner.Plan) bool { return !p.Valid() })
	if !strings.HasPrefix(gave.Error, "preempted by plan big (priority 10): ") || !strings.Contains(gave.Reason, "gave way to plan big") {
		t.Fatalf("low's error %q, reason %q", gave.Error, gave.Reason)
	}
	if gave.Revision != low.Revision+1 || len(gave.PreemptedBy) != 1 {
		t.Fatalf("low: revision %d after %d, preempted by %v", gave.Revision, low.Revision, gave.PreemptedBy)
	}
	keep2 := h.waitFor("keep", "any", func(*planner.Plan) bool { return true })
	if keep2.Revision != keep.Revision {
		t.Fatalf("keep republished (revision %d): %s", keep2.Revision, keep2.Reason)
	}
	h.checkShared(keep, big, gave)

	// Per plan: lookup, a node's assignments, validation for a priority.
	c, err := client.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Lookup(ctx, "big", "train", 15)
	if err != nil || w.Plan != "big" {
		t.Fatalf("lookup big train 15: %+v, %v", w, err)
	}
	a, err := c.Assignment(ctx, "low", big.Workers.At(0).NodeID)
	if err == nil && len(a.Workers) > 0 {
		t.Fatalf("low still assigned on %s: %+v", a.NodeID, a.Workers)
	}
	reply, err := c.Validate(ctx, []byte(shareSpec(8, 10)))
	if err != nil || !reply.Valid() {
		t.Fatalf("8 GPUs at priority 10 (4 free, low's would give way): %+v %v", reply, err)
	}
	reply, err = c.Validate(ctx, []byte(shareSpec(8, 5)))
	if err != nil || reply.Valid() {
		t.Fatalf("8 GPUs at priority 5 (4 free beside keep and big): valid %v, %v", reply.Valid(), err)
	}
	// As keep's own new spec, keep's 12 GPUs are not in the way.
	reply, err = c.ValidateAs(ctx, "keep", []byte(shareSpec(16, 5)))
	if err != nil || !reply.Valid() || reply.Name != "keep" {
		t.Fatalf("16 GPUs as keep (12 its own, 4 free): %+v, %v", reply, err)
	}

	// big leaves: its last revision says so, low comes back.
	if err := specs.Delete(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	gone := h.waitFor("big", "removed", func(p *planner.Plan) bool { return p.Removed() })
	if gone.Valid() || gone.Workers.Len() != 0 || gone.Revision != big.Revision+1 {
		t.Fatalf("big's last revision: valid %v, %d workers, revision %d", gone.Valid(), gone.Workers.Len(), gone.Revision)
	}
	back := h.waitFor("low", "valid again", valid)
	if back.Revision != gave.Revision+1 || !strings.Contains(back.Reason, "room again") {
		t.Fatalf("low back: revision %d, reason %q", back.Revision, back.Reason)
	}
	h.checkShared(keep, back)
	if a, err := c.Assignment(ctx, "big", big.Workers.At(0).NodeID); err == nil && len(a.Workers) > 0 {
		t.Fatalf("big still assigned on %s", a.NodeID)
	}
}

// TestSeveralPlansQuota: a plan over its max_gpus is invalid and says
// so; its quota raised, it is placed.
func TestSeveralPlansQuota(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"exp": "max_gpus: 4\n" + shareSpec(6, 0)})
	stop := h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	p := h.waitFor("exp", "invalid", func(p *planner.Plan) bool { return !p.Valid() })
	if p.Error != "max_gpus: the plan needs 6 GPUs; its quota is 4" {
		t.Fatalf("error %q", p.Error)
	}
	if _, err := specs.Put(ctx, "exp", []byte("max_gpus: 6\n"+shareSpec(6, 0))); err != nil {
		t.Fatal(err)
	}
	h.waitFor("exp", "valid", func(p *planner.Plan) bool { return p.Valid() })
}

// TestSeveralPlansFailover: of two planners of one cluster the standby
// follows every plan; when the leader dies it takes over all of them,
// publishes nothing while nothing changed, and continues each plan's
// sequence, never giving a GPU twice.
func TestSeveralPlansFailover(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	specs := h.cluster(4, map[string]string{"a": shareSpec(12, 1), "b": shareSpec(12, 0)})
	url := h.url()
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	leader := h.instance(url, cfg)
	valid := func(p *planner.Plan) bool { return p.Valid() }
	a1, b1 := h.waitFor("a", "valid", valid), h.waitFor("b", "valid", valid)
	standby := h.instance(url, cfg)
	if h.waitLeader(5*time.Second, leader, standby) != leader {
		t.Fatal("the first planner does not lead")
	}
	standby.following(t, map[string]int{"a": a1.Revision, "b": b1.Revision})

	leader.crash()
	h.waitLeader(5*time.Second, standby)
	standby.replanned(t, "a") // on taking the lease, every plan at once
	if a := h.waitFor("a", "any", valid); a.Revision != a1.Revision {
		t.Fatalf("plan a republished on takeover: revision %d (%s)", a.Revision, a.Reason)
	}
	if b := h.waitFor("b", "any", valid); b.Revision != b1.Revision {
		t.Fatalf("plan b republished on takeover: revision %d (%s)", b.Revision, b.Reason)
	}

	// A third plan of the highest priority: b gives way, published by the
	// new leader in b's own sequence.
	if _, err := specs.Put(ctx, "c", []byte(shareSpec(16, 5))); err != nil {
		t.Fatal(err)
	}
	c := h.waitFor("c", "valid", valid)
	b2 := h.waitFor("b", "invalid", func(p *planner.Plan) bool { return !p.Valid() })
	if b2.Revision != b1.Revision+1 || !strings.HasPrefix(b2.Error, "preempted by plan c (priority 5)") {
		t.Fatalf("b after c: revision %d, error %q", b2.Revision, b2.Error)
	}
	h.checkShared(h.waitFor("a", "any", valid), b2, c)
}

// BenchmarkSeveralPlansNodeLeaves: 20 plans (1,800 GPUs each,
// priorities 0 to 3) share 5,000 8-GPU nodes on an embedded server; per
// op a node one plan uses leaves, and the op ends when that plan's next
// revision is stored. It reports the revisions published per op (only
// the plan that lost workers should publish).
func BenchmarkSeveralPlansNodeLeaves(b *testing.B) {
	nc := natstest.Start(b).Conn(b)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	inv := store.NewInventoryStore(js)
	for i := range 5000 {
		id := fmt.Sprintf("n%04d", i)
		if _, err := inv.Put(ctx, id, simDoc(id), false, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	specs := store.NewSpecStore(js)
	names := make([]string, 20)
	for i := range names {
		names[i] = fmt.Sprintf("plan-%02d", i)
		spec := fmt.Sprintf(`priority: %d
scheduling:
  train:  {worker_num: 450, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 450, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 3600, num_cpus: 0, num_gpus: 0.25}
`, i%4)
		if _, err := specs.Put(ctx, names[i], []byte(spec)); err != nil {
			b.Fatal(err)
		}
	}
	p := New(Config{NC: nc, JS: js, Settle: -1, Log: zerolog.Nop()})
	go func() { _ = p.Run(ctx) }()
	plans := store.NewPlanStore(js)
	latest := func(name string) *store.StoredPlan {
		var sp *store.StoredPlan
		natstest.WaitFor(b, 5*time.Minute, "plan "+name, func() bool {
			var err error
			sp, err = plans.Latest(ctx, name)
			return err == nil && sp != nil
		})
		return sp
	}
	var victims []string
	for _, name := range names {
		sp := latest(name)
		if !sp.Plan.Valid() {
			b.Fatalf("%s: %s", name, sp.Plan.Error)
		}
		victims = append(victims, sp.Plan.Workers.At(0).NodeID)
	}
	st, err := js.Stream(ctx, client.PlansStream)
	if err != nil {
		b.Fatal(err)
	}
	count := func() uint64 {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("poolplanner.plans.*"))
		if err != nil {
			b.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	before := count()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		name := names[i%len(names)]
		subject := client.PlanEventSubject(name)
		was, err := plans.LastEvent(ctx, subject)
		if err != nil {
			b.Fatal(err)
		}
		if err := inv.Delete(ctx, victims[i%len(victims)], time.Hour); err != nil {
			b.Fatal(err)
		}
		natstest.WaitFor(b, time.Minute, "plan "+name+"'s next revision", func() bool {
			now, err := plans.LastEvent(ctx, subject)
			return err == nil && now.Seq != was.Seq
		})
	}
	b.StopTimer()
	// Any other revisions of the last op: its replan may publish more
	// than the one waited for; the planner idle has published them all.
	ictx, icancel := context.WithTimeout(ctx, time.Minute)
	defer icancel()
	if err := p.Idle(ictx); err != nil {
		b.Fatalf("the planner not idle after the last op: %v", err)
	}
	b.ReportMetric(float64(count()-before)/float64(b.N), "revisions/op")
}

// TestSeveralPlansNodeLeaves: a node dies; each plan that had workers
// on it says so in its next revision (every plan keeps its own change
// log), and a plan that had none publishes nothing.
func TestSeveralPlansNodeLeaves(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	h.cluster(4, map[string]string{"a": shareSpec(8, 1), "b": shareSpec(8, 0), "c": shareSpec(4, 0)})
	stop := h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	valid := func(p *planner.Plan) bool { return p.Valid() }
	first := map[string]*planner.Plan{}
	for _, name := range []string{"a", "b", "c"} {
		first[name] = h.waitFor(name, "valid", valid)
	}
	victim := first["b"].Workers.At(0).NodeID
	h.kill(victim)
	b := h.waitFor("b", "a revision after the node left", func(p *planner.Plan) bool { return p.Revision > first["b"].Revision })
	if !b.Valid() || !strings.Contains(b.Reason, "nodes left: "+victim) {
		t.Fatalf("b's revision %d: valid %v, reason %q", b.Revision, b.Valid(), b.Reason)
	}
	// The replan that published b's revision planned a and c too.
	h.waitPublished("b", 2)
	for _, name := range []string{"a", "c"} {
		p := h.waitFor(name, "any", func(*planner.Plan) bool { return true })
		on := len(first[name].NodeIndex()(victim)) > 0
		switch {
		case on && (p.Revision == first[name].Revision || !strings.Contains(p.Reason, "nodes left: "+victim)):
			t.Errorf("%s had workers on %s: revision %d, reason %q", name, victim, p.Revision, p.Reason)
		case !on && p.Revision != first[name].Revision:
			t.Errorf("%s had none on %s but published revision %d: %q", name, victim, p.Revision, p.Reason)
		}
	}
}
