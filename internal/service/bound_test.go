package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// hugeSpec is 70 bytes asking for two million workers of nothing.
const hugeSpec = "scheduling: {train: {worker_num: 2000000, num_gpus: 0, num_cpus: 0}}\n"

// hugeWhy is what a plan of hugeSpec says on four nodes.
const hugeWhy = "scheduling.train.worker_num: 2000000 workers in all, more than this cluster can hold: 4 nodes at most 1024 workers each"

// TestHugeSpecBounded: the 70-byte spec of two million workers of no
// GPU and no CPU, stored straight into the spec bucket (no validation),
// leaves the planner replanning a node's loss within seconds, before and
// after a restart: its plan is invalid and says why, naming the field,
// and holds nothing. Validation (what spec set asks) refuses it the
// same way, and removing its spec releases it like any plan.
func TestHugeSpecBounded(t *testing.T) {
	t.Parallel()
	cfg := Config{Spec: []byte(testSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	r := newRide(t, 4, cfg)
	first := r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	ctx := context.Background()
	specs := store.NewSpecStore(r.js)
	if _, err := specs.Put(ctx, "huge", []byte(hugeSpec)); err != nil {
		t.Fatal(err)
	}
	plans := store.NewPlanStore(r.js)
	hugePlan := func(what string, ok func(*planner.Plan) bool) {
		t.Helper()
		natstest.WaitFor(t, 10*time.Second, "plan huge "+what, func() bool {
			sp, err := plans.Latest(ctx, "huge")
			return err == nil && sp != nil && ok(sp.Plan)
		})
	}
	hugePlan("refused, naming its field", func(p *planner.Plan) bool {
		return p.Revision == 1 && !p.Valid() && strings.Contains(p.Error, hugeWhy) && p.Workers.Len() == 0
	})

	c, err := client.New(r.p.cfg.NC)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Validate(ctx, []byte(hugeSpec))
	if err != nil || reply.Valid() || !strings.Contains(reply.Error, hugeWhy) {
		t.Fatalf("validating the huge spec: %v, %+v", err, reply)
	}

	// A node's loss is replanned within seconds.
	gone := first.Workers.At(0).NodeID
	r.crashReporter(gone)
	second := r.waitPlan(10*time.Second, "without "+gone, func(p *planner.Plan) bool { return p.Revision >= 2 && !onNode(p, gone) })
	// huge's revision on three nodes comes after default's (a plan
	// giving room back is published first): stopping before it would
	// leave revision 1, whose words the restart on four nodes repeats.
	hugePlan("on three nodes", func(p *planner.Plan) bool {
		return p.Revision == 2 && strings.Contains(p.Error, "3 nodes at most 1024 workers each")
	})

	// And after a restart.
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	nc, js := rideConn(t, r.srv.URL())
	cfg.NC, cfg.JS, cfg.Log = nc, js, zerolog.New(&r.logs)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r.reporter(gone) // back: the restarted planner plans on it
	hugePlan("on four nodes after the restart", func(p *planner.Plan) bool {
		return p.Revision > 2 && strings.Contains(p.Error, hugeWhy)
	})
	next := second.Workers.At(0).NodeID
	r.crashReporter(next)
	r.waitPlan(10*time.Second, "without "+next+" after the restart", func(p *planner.Plan) bool { return !onNode(p, next) })

	// spec rm: its last revision says it is removed.
	if err := specs.Delete(ctx, "huge"); err != nil {
		t.Fatal(err)
	}
	hugePlan("removed", func(p *planner.Plan) bool { return p.Removed() })
}

// TestReadTimeoutScales: reading a plan's latest revision gets time for
// its workers as well as the nodes: those of the revision known, else
// those its spec asks for, as many as the inventory could hold.
func TestReadTimeoutScales(t *testing.T) {
	p := drive(New(Config{Log: zerolog.Nop(), StoreTimeout: time.Second}))
	for i := range 3 {
		id := fmt.Sprintf("n%d", i)
		if _, err := p.live.put(id, inv(id, 8, 64)); err != nil {
			t.Fatal(err)
		}
	}
	huge, err := planner.ParseSpec([]byte(hugeSpec))
	if err != nil {
		t.Fatal(err)
	}
	small, err := planner.ParseSpec([]byte(testSpec))
	if err != nil {
		t.Fatal(err)
	}
	placed := func(n int) *store.StoredPlan {
		doc := &planner.Plan{}
		doc.Workers = plan.NewWorkers(make([]plan.Worker, n))
		return &store.StoredPlan{Plan: doc}
	}
	for _, c := range []struct {
		name   string
		spec   *planner.Spec
		latest *store.StoredPlan
		want   time.Duration
	}{
		{"nothing known", nil, nil, time.Second + 3*storePerItem},
		{"a revision of 80,000 workers", nil, placed(80000), time.Second + (3+10000)*storePerItem},
		{"its spec, a small one", small, nil, time.Second + (3+13/8)*storePerItem},
		{"its spec, more than the cluster holds", huge, nil, time.Second + (3+3*planner.MaxNodeWorkers/8)*storePerItem},
		{"a revision larger than the spec", small, placed(8000), time.Second + (3+1000)*storePerItem},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newPlanState("p", zerolog.Nop())
			s.spec, s.latest = c.spec, c.latest
			if got := p.readTimeout(s); got != c.want {
				t.Errorf("readTimeout %v, want %v", got, c.want)
			}
		})
	}
}
