package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// heldSpecs is a spec bucket whose watch delivers the entries after
// revision after only one at a time, each when the test lets it (a
// watch behind the plan stream): let lets one through, and returns once
// the planner's loop took it (the channel is unbuffered), so that it is
// handled before anything the loop takes next.
type heldSpecs struct {
	memSpecs
	after uint64
	let   chan struct{}
}

func (g heldSpecs) Ensure(ctx context.Context) (kvBucket, error) {
	b, err := g.memSpecs.Ensure(ctx)
	return heldBucket{b, g}, err
}

func (g heldSpecs) Bucket(ctx context.Context) (kvBucket, error) { return g.Ensure(ctx) }

type heldBucket struct {
	kvBucket
	g heldSpecs
}

func (b heldBucket) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := b.kvBucket.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	out := &memWatcher{updates: make(chan jetstream.KeyValueEntry), stop: func() { cancel(); _ = w.Stop() }}
	go func() {
		defer close(out.updates)
		for e := range w.Updates() {
			if e != nil && e.Revision() > b.g.after {
				select {
				case <-b.g.let:
				case <-wctx.Done():
					return
				}
			}
			select {
			case out.updates <- e:
			case <-wctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestStandbyWatchBehindKeepsPlacement (review rev13): a standby whose
// spec watch delivers the removal and the put after it late, after it
// followed the leader's removal and fresh placement of that put, takes
// the lease without releasing the fresh placement (its workers running):
// the removal is older than the spec the latest was planned on
// (Poolplanner-Spec-Revision). Before, the removal was taken to be
// after whatever latest the standby held when the put came (revisions
// 4, removed, and 5, fresh, published). Taking the lease with only the
// removal delivered, it holds the placement too: the put is to come.
func TestStandbyWatchBehindKeepsPlacement(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	for _, tc := range []struct {
		name string
		// early: the entries after the first spec the standby's watch
		// delivers before it follows revision 3; late: after, before it
		// takes the lease. The rest it gets after its first replan.
		early, late int
	}{
		{"the put late", 1, 1},
		{"the removal and the put late", 0, 2},
		{"the put after taking the lease", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a})
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
			lead := h.instance("", cfg)
			h.waitRevision(1)
			let := make(chan struct{})
			standby := h.instance("", cfg, func(p *Service) {
				p.specs = heldSpecs{memSpecs{h.mem.specs}, h.mem.specs.seq, let}
			})
			if h.waitLeader(5*time.Second, lead, standby) != lead {
				t.Fatal("the first planner does not lead")
			}
			standby.following(t, map[string]int{"default": 1})
			if err := specs.Delete(context.Background(), "default"); err != nil {
				t.Fatal(err)
			}
			for range tc.early {
				let <- struct{}{}
			}
			h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
			if _, err := specs.Put(context.Background(), "default", []byte(a)); err != nil {
				t.Fatal(err)
			}
			h.waitFor("default", "placed again", func(p *planner.Plan) bool { return p.Revision == 3 && p.Valid() })
			standby.following(t, map[string]int{"default": 3})
			for range tc.late {
				let <- struct{}{}
			}
			lead.stop()
			if h.waitLeader(10*time.Second, standby) != standby {
				t.Fatal("the standby does not lead")
			}
			// Its first replan, or a revision of its own (a removal
			// published: no replan of the plan counted).
			natstest.WaitFor(t, 15*time.Second, "the standby's first replan or revision", func() bool {
				return scraped(t, standby.reg)[`poolplanner_replan_duration_seconds{plan="default"}`] >= 1 ||
					len(h.mem.revisions("default")) > 3
			})
			if revs := h.mem.revisions("default"); len(revs) != 3 {
				t.Fatalf("revisions %v; want 1-3, the leader's, and none of the standby's", revs)
			}
			if rest := 2 - tc.early - tc.late; rest > 0 {
				for range rest {
					let <- struct{}{}
				}
				// The put delivered: the replan it kicks publishes
				// nothing either (the placement is the spec's).
				standby.replannedTimes(t, "default", 2)
				if revs := h.mem.revisions("default"); len(revs) != 3 {
					t.Fatalf("revisions %v after the put delivered; want 1-3", revs)
				}
			}
		})
	}
}

// TestPreHeaderDigestNotInHistory (review rev13): a revision from
// before planners said their spec's revision, whose digest no put of
// the history has (an older build's digest), is kept when the history
// holds a removal: which removal, if any, came after its spec is not
// known. Before, any old removal (this one released and placed afresh
// already) released it again.
func TestPreHeaderDigestNotInHistory(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n"
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": a})
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
	stop := h.plannerWith(context.Background(), cfg)
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if err := specs.Delete(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
	if _, err := specs.Put(context.Background(), "default", []byte(a)); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "placed again", func(p *planner.Plan) bool { return p.Revision == 3 && p.Valid() })
	if _, err := specs.Put(context.Background(), "default", []byte(b)); err != nil {
		t.Fatal(err)
	}
	last := h.waitFor("default", "b placed", func(p *planner.Plan) bool { return p.Revision == 4 && p.Valid() })
	stop()
	h.mem.mu.Lock()
	for i := range h.mem.msgs {
		h.mem.msgs[i].specRevision = 0
		h.mem.msgs[i].specDigest = "0123456789abcdef01234567" // no spec's
	}
	h.mem.mu.Unlock()
	stop = h.plannerWith(context.Background(), cfg)
	defer stop()
	h.waitReplans("default", 1)
	for _, p := range h.history() {
		if p.Revision > last.Revision && (p.Removed() || p.Workers.Len() != last.Workers.Len()) {
			t.Fatalf("revision %d: removed %v, %d workers (reason %q); want revision %d's placement kept",
				p.Revision, p.Removed(), p.Workers.Len(), p.Reason, last.Revision)
		}
	}
}

// failingHistory is a spec bucket whose History fails while fail is set
// (a replica that cannot answer).
type failingHistory struct {
	memSpecs
	fail *atomic.Bool
}

func (g failingHistory) Ensure(ctx context.Context) (kvBucket, error) {
	b, err := g.memSpecs.Ensure(ctx)
	return failingHistoryBucket{b, g.fail}, err
}

func (g failingHistory) Bucket(ctx context.Context) (kvBucket, error) { return g.Ensure(ctx) }

type failingHistoryBucket struct {
	kvBucket
	fail *atomic.Bool
}

func (b failingHistoryBucket) History(ctx context.Context, key string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	if b.fail.Load() {
		return nil, context.DeadlineExceeded
	}
	return b.kvBucket.History(ctx, key, opts...)
}

// TestRemovalUntoldHeld (review rev13): a planner restarted on a spec
// removed and stored again while none ran, whose history it cannot read
// at first, holds the placement as it is (publishes nothing) until it
// can, then releases it and places the spec stored since afresh. Before,
// it planned the new spec at once ("spec changed", on the new spec's
// revision), and the retry found no removal after that: never released.
func TestRemovalUntoldHeld(t *testing.T) {
	t.Parallel()
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
	h := removedWhileStopped(t, cfg)
	var fail atomic.Bool
	fail.Store(true)
	in := h.instance("", cfg, func(p *Service) { p.specs = failingHistory{memSpecs{h.mem.specs}, &fail} })
	in.replanned(t, "default")
	if revs := h.mem.revisions("default"); len(revs) != 1 {
		t.Fatalf("revisions %v with the history unreadable; want 1 only, held", revs)
	}
	fail.Store(false)
	last := h.waitFor("default", "placed again", func(p *planner.Plan) bool { return p.Revision > 1 && p.Valid() })
	hist := h.history()
	if len(hist) != 3 || !hist[1].Removed() || last.Revision != 3 || last.Status.Fresh == "" || last.Workers.Len() != 8 {
		for _, p := range hist {
			t.Logf("revision %d: %s, removed %v, %d workers, %q", p.Revision, p.PlanState(), p.Removed(), p.Workers.Len(), p.Reason)
		}
		t.Fatal("want revision 2 removed, then 3 placed afresh on 8 workers")
	}
}

// failingRemoval fails the publish of a removal (a revision that says
// its plan removed) while fail is set, as a timeout or a lease lost
// would; failed counts those failed.
type failingRemoval struct {
	planStore
	fail   *atomic.Bool
	failed *atomic.Int64
}

func (f failingRemoval) PublishEventFor(ctx context.Context, ev *plan.Event, d store.Digests, expect, lease uint64) (uint64, error) {
	if ev.Removed() && f.fail.CompareAndSwap(true, false) {
		f.failed.Add(1)
		return 0, errors.New("publishing a removal: injected failure")
	}
	return f.planStore.PublishEventFor(ctx, ev, d, expect, lease)
}

// A removal while no planner ran, read from the spec's history by the
// next, is published at the replan after its first publish failed: the
// failure does not leave the new spec planned on the old placement
// (before, the history was noted as checked before the publish, and the
// retry took the removal as told).
func TestRemovalPublishFailedRetried(t *testing.T) {
	t.Parallel()
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
	h := removedWhileStopped(t, cfg)
	var fail atomic.Bool
	var failed atomic.Int64
	fail.Store(true)
	h.instance("", cfg, func(p *Service) { p.plans = failingRemoval{p.plans, &fail, &failed} })
	last := h.waitFor("default", "b placed", func(p *planner.Plan) bool { return p.Revision > 1 && p.Valid() && p.Workers.Len() == 8 })
	if failed.Load() != 1 {
		t.Fatalf("%d removal publishes failed; want the first one", failed.Load())
	}
	// The removal goes out before the plan is placed again: by now it is
	// in the history, or it never will be.
	hist := h.history()
	if len(hist) != 3 || !hist[1].Removed() || last.Revision != 3 || last.Status.Fresh == "" {
		for _, p := range hist {
			t.Logf("revision %d: removed %v, %d workers, fresh %q, %q", p.Revision, p.Removed(), p.Workers.Len(), p.Status.Fresh, p.Reason)
		}
		t.Fatal("want revision 2 removed (published at the retry), then 3 placed afresh on 8 workers")
	}
}

// A spec that does not parse, stored after the spec was removed, brings
// back no spec from before the removal (lastGoodSpec stops at the
// marker; before, it walked past it and planned the deleted spec
// again): with a planner running through the delete, the plan stays
// released; with both stored while no planner ran, the next releases
// the removed spec's placement and plans nothing. Plan other's change,
// stored after the bad put, is a replan of both taken after it.
func TestBadPutAfterRemovalNotPlanned(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const other1 = "scheduling:\n  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}\n"
	const other2 = "scheduling:\n  train: {worker_num: 3, num_cpus: 1, num_gpus: 1}\n"
	for _, running := range []bool{true, false} {
		t.Run(map[bool]string{true: "running", false: "stopped"}[running], func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a, "other": other1})
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
			stop := h.plannerWith(context.Background(), cfg)
			h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
			h.waitFor("other", "valid", func(p *planner.Plan) bool { return p.Valid() })
			if !running {
				stop()
			}
			if err := specs.Delete(context.Background(), "default"); err != nil {
				t.Fatal(err)
			}
			if running {
				h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
			}
			h.mem.mu.Lock()
			h.mem.specs.write("default", []byte("scheduling: [not, a, spec"), jetstream.KeyValuePut, 0)
			h.mem.mu.Unlock()
			if !running {
				stop = h.plannerWith(context.Background(), cfg)
			}
			defer stop()
			if _, err := specs.Put(context.Background(), "other", []byte(other2)); err != nil {
				t.Fatal(err)
			}
			h.waitFor("other", "on its new spec", func(p *planner.Plan) bool { return p.Valid() && p.Workers.Len() == 3 })
			hist := h.history()
			if last := hist[len(hist)-1]; len(hist) != 2 || !last.Removed() || last.Workers.Len() != 0 {
				for _, p := range hist {
					t.Logf("revision %d: removed %v, %d workers, %q", p.Revision, p.Removed(), p.Workers.Len(), p.Reason)
				}
				t.Fatal("want revision 1 placed, then 2 removed and nothing after: the deleted spec is not planned again")
			}
		})
	}
}

// deafSpecs is a spec bucket whose watches, while deaf is set, lose
// what comes after their initial values (a connection down), counting
// each in lost; a watch made after delivers the bucket as it is.
type deafSpecs struct {
	memSpecs
	deaf *atomic.Bool
	lost *atomic.Int64
}

func (g deafSpecs) Ensure(ctx context.Context) (kvBucket, error) {
	b, err := g.memSpecs.Ensure(ctx)
	return deafBucket{b, g.deaf, g.lost}, err
}
func (g deafSpecs) Bucket(ctx context.Context) (kvBucket, error) { return g.Ensure(ctx) }

type deafBucket struct {
	kvBucket
	deaf *atomic.Bool
	lost *atomic.Int64
}

func (b deafBucket) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := b.kvBucket.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	out := &memWatcher{updates: make(chan jetstream.KeyValueEntry), stop: func() { cancel(); _ = w.Stop() }}
	go func() {
		defer close(out.updates)
		initial := true
		for e := range w.Updates() {
			if e == nil {
				initial = false
			} else if !initial && b.deaf.Load() {
				b.lost.Add(1)
				continue
			}
			select {
			case out.updates <- e:
			case <-wctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// countedLink says it reconnected n times.
type countedLink struct {
	link
	n *atomic.Uint64
}

func (c countedLink) Reconnects() uint64 { return c.n.Load() }

// A spec deleted and put again while the planner's connection was down
// reaches it, once its watches are made again (restartWatches), as the
// put alone: the removal is read from the history then and taken as if
// delivered, as by a planner whose watch stayed up. A good put is
// placed afresh after the release (before, the latest, published by
// this planner with its watch live, was taken as checked, and the new
// spec planned on the old placement); one that does not parse leaves
// the plan released (review rev16: the spec the user deleted, kept as
// the last good one, was placed again).
func TestRemovalDuringReconnectReleased(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n"
	const other = "scheduling:\n  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}\n"
	for _, tc := range []struct {
		name string
		put  string
		want int // workers of the last revision; 0: the removal is the last
	}{
		{"a good spec put", b, 8},
		{"a spec that does not parse put", "scheduling: [not, a, spec", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a, "other": other})
			var deaf atomic.Bool
			var lost atomic.Int64
			var reconnects atomic.Uint64
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, guardRound: quickGuard}
			h.instance("", cfg, func(p *Service) {
				p.specs = deafSpecs{memSpecs{h.mem.specs}, &deaf, &lost}
				p.link = countedLink{p.link, &reconnects}
			})
			h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
			h.waitFor("other", "valid", func(p *planner.Plan) bool { return p.Valid() })
			deaf.Store(true)
			if err := specs.Delete(context.Background(), "default"); err != nil {
				t.Fatal(err)
			}
			h.mem.mu.Lock()
			h.mem.specs.write("default", []byte(tc.put), jetstream.KeyValuePut, 0)
			h.mem.mu.Unlock()
			natstest.WaitFor(t, 10*time.Second, "the delete and the put lost to the watch", func() bool { return lost.Load() == 2 })
			deaf.Store(false)
			reconnects.Add(1) // the guard makes the watches again
			if tc.want > 0 {
				h.waitFor("default", "placed afresh", func(p *planner.Plan) bool { return p.Valid() && p.Workers.Len() == tc.want })
			} else {
				h.waitFor("default", "released", func(p *planner.Plan) bool { return p.Removed() })
			}
			// Another plan's change replanned after it: whatever the
			// put made of default is published by then.
			if _, err := specs.Put(context.Background(), "other", []byte("scheduling:\n  train: {worker_num: 3, num_cpus: 1, num_gpus: 1}\n")); err != nil {
				t.Fatal(err)
			}
			h.waitFor("other", "other replanned", func(p *planner.Plan) bool { return p.Revision >= 2 })
			hist := h.history()
			last := hist[len(hist)-1]
			ok := len(hist) >= 2 && hist[1].Removed()
			if tc.want > 0 {
				ok = ok && len(hist) == 3 && last.Workers.Len() == tc.want && last.Status.Fresh != ""
			} else {
				ok = ok && len(hist) == 2
			}
			if !ok {
				for _, p := range hist {
					t.Logf("revision %d: removed %v, %d workers, fresh %q, %q", p.Revision, p.Removed(), p.Workers.Len(), p.Status.Fresh, p.Reason)
				}
				t.Fatalf("want revision 2 removed, then %d workers placed afresh (0: nothing after)", tc.want)
			}
		})
	}
}

// A spec bucket lost and made again while the planner runs numbers its
// revisions from 1 again: the planner puts its spec back as revision 1,
// below the spec revision its latest was planned on (3). A removal
// there (revision 2) is released, not held for ever as one the latest's
// planner saw (checkRenumbered: the key's history is all below the
// latest's spec revision), and the spec put after it placed afresh.
func TestRemovalAfterSpecBucketRecreated(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n"
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": a})
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, guardRound: quickGuard}
	h.instance("", cfg)
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	for i, s := range []string{b, a} {
		if _, err := specs.Put(context.Background(), "default", []byte(s)); err != nil {
			t.Fatal(err)
		}
		h.waitFor("default", "replanned", func(p *planner.Plan) bool { return p.Revision == i+2 })
	}
	h.mem.specs.lose()
	natstest.WaitFor(t, 10*time.Second, "the spec put back in a new bucket", func() bool {
		h.mem.mu.Lock()
		defer h.mem.mu.Unlock()
		return !h.mem.specs.gone && len(h.mem.specs.recs) == 1
	})
	if err := specs.Delete(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
	if _, err := specs.Put(context.Background(), "default", []byte(b)); err != nil {
		t.Fatal(err)
	}
	last := h.waitFor("default", "b placed", func(p *planner.Plan) bool { return p.Valid() && p.Workers.Len() == 8 })
	hist := h.history()
	if len(hist) != 5 || !hist[3].Removed() || last.Revision != 5 || last.Status.Fresh == "" {
		for _, p := range hist {
			t.Logf("revision %d: removed %v, %d workers, fresh %q, %q", p.Revision, p.Removed(), p.Workers.Len(), p.Status.Fresh, p.Reason)
		}
		t.Fatal("want revision 4 removed, then 5 placed afresh on 8 workers")
	}
}

// removedWhileStopped is a harness of 4 nodes whose plan default, on
// 16 train workers, a planner placed and stopped; its spec was then
// deleted and one of 8 train workers stored, with no planner running:
// a removal the next planner learns only from the spec's history.
func removedWhileStopped(t *testing.T, cfg Config) *harness {
	t.Helper()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n"
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": a})
	stop := h.plannerWith(context.Background(), cfg)
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	stop()
	if err := specs.Delete(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := specs.Put(context.Background(), "default", []byte(b)); err != nil {
		t.Fatal(err)
	}
	return h
}
