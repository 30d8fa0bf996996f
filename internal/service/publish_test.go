package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// TestSpecFactsChangePublished: a new spec that places as the old one
// did, but whose document says other facts of it (here env_strategy),
// is published, the same workers in place: kept unpublished, the latest
// revision would tell a planner restarted on it that its placement
// follows another spec than the one stored, and that planner would keep
// it unchecked (a worker on a node lost kept as valid) where this one
// replans it (TestAdoptedSpecFollows in the planner).
func TestSpecFactsChangePublished(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	const spec = "scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\nplacement: {mode: auto, strategy: disaggregate, env_strategy: %s}\n"
	specs := h.cluster(2, map[string]string{"default": fmt.Sprintf(spec, "default")})
	stop := h.plannerWith(context.Background(), Config{Debounce: 50 * time.Millisecond, Settle: -1})
	defer stop()
	first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
	if _, err := specs.Put(context.Background(), "default", []byte(fmt.Sprintf(spec, "device-colocate"))); err != nil {
		t.Fatal(err)
	}
	next := h.waitFor("default", "on the new env_strategy", func(p *planner.Plan) bool { return p.EnvStrategy == "device-colocate" })
	if next.Revision != first.Revision+1 || next.Moved != 0 || !planner.SamePlacement(first, next) {
		t.Fatalf("revision %d (after %d), moved %d, same placement %v; want the next revision, nothing moved", next.Revision, first.Revision, next.Moved, planner.SamePlacement(first, next))
	}
}

// TestRestartFollowsStoredSpec: a planner restarted on a plan whose
// stored spec does not fit, changed while no planner ran or pending
// already, keeps the placement on the spec it follows (found in the
// spec's history by the digest its revision was published on, or,
// pending, the one it says its placement follows), checked against the
// inventory as one that kept running does: a worker whose node went
// while no planner ran is re-placed, not kept there as valid. A spec
// that was pending and never in force is not taken for it, though its
// demands are the same (review rev5: one over its quota released the
// plan).
func TestRestartFollowsStoredSpec(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	train := func(n int) string {
		return fmt.Sprintf("scheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", n)
	}
	type put struct {
		spec string
		// pending is what the revision it makes says is pending.
		pending string
	}
	for _, tc := range []struct {
		name   string
		before []put  // each waited for as a pending revision
		after  string // stored while no planner runs
	}{
		{"spec changed while stopped", nil, train(64)},
		{"pending twice before the stop", []put{{train(64), "required 64"}, {train(48), "required 48"}}, ""},
		{"pending over its quota, then more", []put{{a + "max_gpus: 4\n", "quota is 4"}, {train(64), "required 64"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a})
			store := func(spec string) {
				if _, err := specs.Put(context.Background(), "default", []byte(spec)); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
			stop := h.plannerWith(context.Background(), cfg)
			first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
			for _, b := range tc.before {
				store(b.spec)
				first = h.waitFor("default", "pending: "+b.pending, func(p *planner.Plan) bool {
					return p.PendingSpec != nil && strings.Contains(p.PendingSpec.Reason, b.pending)
				})
			}
			stop()
			if tc.after != "" {
				store(tc.after)
			}
			gone := first.Workers.At(0).NodeID
			h.kill(gone)
			stop = h.plannerWith(context.Background(), cfg)
			defer stop()
			next := h.waitFor("default", "a revision after the restart", func(p *planner.Plan) bool { return p.Revision > first.Revision })
			if !next.Valid() || next.PendingSpec == nil || next.Workers.Len() != first.Workers.Len() {
				t.Fatalf("revision %d: state %s, pending %v, %d workers (had %d), error %q; want them kept valid on the spec in force, the new one pending",
					next.Revision, next.PlanState(), next.PendingSpec != nil, next.Workers.Len(), first.Workers.Len(), next.Error)
			}
			for _, w := range next.Workers.All() {
				if w.NodeID == gone {
					t.Fatalf("%s %d kept on %s, gone while no planner ran", w.Component, w.Index, gone)
				}
			}
		})
	}
}

// TestAdoptedSpecAfterRestart: a spec change that places the same and
// keeps the spec facts publishes nothing (adopted); a node lost next is
// planned on the new spec whether the planner kept running or restarted
// in between (review rev5: the restarted one took the old spec of the
// stored revision's digest, and said the new one was pending).
func TestAdoptedSpecAfterRestart(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 32, num_cpus: 1, num_gpus: 1}\n"
	const b = a + "max_gpus: 32\n"
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted %v", restart), func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a})
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
			stop := h.plannerWith(context.Background(), cfg)
			first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
			// The first revision's replan counted: a revision is in the
			// stream a moment before, and the wait for b's replan below
			// would end on it, the node's loss then planned with b's
			// change (b pending, CI once).
			done := h.waitPublished("default", 1)
			if _, err := specs.Put(context.Background(), "default", []byte(b)); err != nil {
				t.Fatal(err)
			}
			h.waitReplans("default", done+1) // b replanned: the same placement, adopted
			if rev := h.waitFor("default", "any", func(*planner.Plan) bool { return true }).Revision; rev != first.Revision {
				t.Fatalf("revision %d published for a spec that places the same", rev)
			}
			if restart {
				stop()
			}
			h.kill(first.Workers.At(0).NodeID)
			if restart {
				stop = h.plannerWith(context.Background(), cfg)
			}
			defer stop()
			next := h.waitFor("default", "after the node loss", func(p *planner.Plan) bool { return p.Revision > first.Revision })
			if next.PlanState() != plan.StateDegraded || next.PendingSpec != nil {
				t.Errorf("revision %d: %s, pending %+v; want degraded on the spec in force, none pending", next.Revision, next.PlanState(), next.PendingSpec)
			}
		})
	}
}

// TestFollowedSpecHistoryUnreadable (review rev8): a restarted planner
// that cannot read the spec history it needs keeps the placement as it
// is for that replan, and checks it as soon as the history reads again,
// not only at the next change: a worker on a node lost while no
// planner ran is re-placed.
func TestFollowedSpecHistoryUnreadable(t *testing.T) {
	t.Parallel()
	train := func(n int) string {
		return fmt.Sprintf("scheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", n)
	}
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": train(16)})
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
	stop := h.plannerWith(context.Background(), cfg)
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if _, err := specs.Put(context.Background(), "default", []byte(train(64))); err != nil {
		t.Fatal(err)
	}
	first := h.waitFor("default", "pending", func(p *planner.Plan) bool { return p.PendingSpec != nil })
	stop()
	gone := first.Workers.At(0).NodeID
	h.kill(gone)
	failing := newHang("reading the history", false)
	failing.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	p := New(Config{Debounce: 50 * time.Millisecond, Settle: -1, NoService: true, StoreTimeout: 500 * time.Millisecond,
		storeHook: failing.hook, Log: zerolog.Nop(), Clock: h.mem.clock})
	h.mem.onMem(p)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	h.waitFor("default", "a revision while the history cannot be read", func(p *planner.Plan) bool { return p.Revision > first.Revision })
	failing.armed.Store(false)
	h.waitFor("default", "no worker on "+gone+" once the history reads", func(p *planner.Plan) bool { return !onNode(p, gone) })
}

// TestStateFileKeepsPlacedFor (review rev8): a plan stream lost while a
// plan's spec is pending is republished from the state file with the
// digest of the spec its placement follows, so that a later restart
// still checks the placement on it.
func TestStateFileKeepsPlacedFor(t *testing.T) {
	t.Parallel()
	train := func(n int) string {
		return fmt.Sprintf("scheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", n)
	}
	h := newMemHarness(t)
	specs := h.cluster(4, map[string]string{"default": train(16)})
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, StateFile: t.TempDir() + "/revisions.json"}
	stop := h.plannerWith(context.Background(), cfg)
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if _, err := specs.Put(context.Background(), "default", []byte(train(64))); err != nil {
		t.Fatal(err)
	}
	first := h.waitFor("default", "pending", func(p *planner.Plan) bool { return p.PendingSpec != nil })
	idle(t, h.newest)
	stop()
	m := h.mem
	m.mu.Lock()
	m.msgs, m.ids = nil, map[string]bool{} // the plan stream lost
	m.mu.Unlock()
	stop = h.plannerWith(context.Background(), cfg)
	resumed := h.waitFor("default", "republished", func(p *planner.Plan) bool { return p.Revision > first.Revision })
	idle(t, h.newest)
	stop()
	gone := resumed.Workers.At(0).NodeID
	h.kill(gone)
	stop = h.plannerWith(context.Background(), cfg)
	defer stop()
	h.waitFor("default", "no worker on "+gone, func(p *planner.Plan) bool { return p.Revision > resumed.Revision && !onNode(p, gone) })
}

// TestRemovedWhileStoppedReleases (review i28w): a spec removed and
// stored again while no planner ran is planned afresh by the planner
// started next, as by one that kept running through the removal: that
// one published the removal (no workers, removed) and then a fresh
// placement of the spec stored since. Without the removal's revision,
// the old placement was kept under the new spec (the removal looked
// past). The same spec stored again is a removal too, as is a purge.
func TestRemovedWhileStoppedReleases(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n"
	type run struct {
		states  []plan.State // of each revision after the first
		fresh   bool         // the last revision placed afresh
		workers int
	}
	for _, again := range []string{a, b} {
		// what runs through the removal and the put again: a planner that
		// kept running, one stopped for both (the spec deleted, or
		// purged; or its revision from before planners said their spec's
		// revision, where only another spec can be told from the one
		// removed), one whose removal and put land in one replan.
		for _, mode := range []string{"running", "restarted", "restarted purged", "restarted no header", "one replan"} {
			if mode == "restarted no header" && again == a {
				continue
			}
			t.Run(fmt.Sprintf("%s/stored again %s", mode, map[string]string{a: "the same", b: "another"}[again]), func(t *testing.T) {
				t.Parallel()
				h := newMemHarness(t)
				specs := h.cluster(4, map[string]string{"default": a})
				cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
				if mode == "one replan" {
					cfg.Debounce = 2 * time.Second // both land in the debounce
				}
				stop := h.plannerWith(context.Background(), cfg)
				first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
				restart := strings.HasPrefix(mode, "restarted")
				if restart {
					stop()
				}
				if mode == "restarted no header" {
					h.mem.mu.Lock()
					for i := range h.mem.msgs {
						h.mem.msgs[i].specRevision = 0
					}
					h.mem.mu.Unlock()
				}
				if mode == "restarted purged" {
					memSpecs{h.mem.specs}.purge("default")
				} else if err := specs.Delete(context.Background(), "default"); err != nil {
					t.Fatal(err)
				}
				if mode == "running" {
					h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
				}
				if _, err := specs.Put(context.Background(), "default", []byte(again)); err != nil {
					t.Fatal(err)
				}
				if restart {
					stop = h.plannerWith(context.Background(), cfg)
				}
				defer stop()
				last := h.waitFor("default", "placed again", func(p *planner.Plan) bool { return p.Revision > first.Revision && p.Valid() })
				hist := h.history()
				var got run
				for _, p := range hist[1:] {
					got.states = append(got.states, p.PlanState())
				}
				got.fresh, got.workers = last.Status.Fresh != "", last.Workers.Len()
				want := run{states: []plan.State{plan.StateInvalid, plan.StateValid}, fresh: true, workers: map[string]int{a: 16, b: 8}[again]}
				if fmt.Sprint(got) != fmt.Sprint(want) || !hist[1].Removed() {
					t.Fatalf("revisions after the first: %+v (second removed: %v); want %+v, the removal then a fresh placement", got, hist[1].Removed(), want)
				}
			})
		}
	}
}

// TestAdoptedSpecFollowedAfterRestart (review i28w): a spec change
// adopted (placed the same, nothing published) is what the placement
// follows after a restart too: a spec stored next that cannot be placed
// is pending on the adopted spec (Poolplanner-Placed-For its digest),
// as with a planner that kept running, not on the one the stored
// revision was published on. A quota the placement does not fit, stored
// while no planner ran, was never adopted: it is not taken for the
// spec in force (taken, the pending spec's replan would release the
// plan, review rev5).
func TestAdoptedSpecFollowedAfterRestart(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	const b = a + "max_gpus: 16\n" // the placement fits: adopted
	const c = "scheduling:\n  train: {worker_num: 64, num_cpus: 1, num_gpus: 1}\n"
	digest := func(spec string) string {
		parsed, err := planner.ParseSpec([]byte(spec))
		if err != nil {
			t.Fatal(err)
		}
		return SpecDigest(parsed)
	}
	for _, tc := range []struct {
		name    string
		restart bool
		stored  []string // while no planner runs, before c
		follows string
	}{
		{"running", false, nil, b},
		{"restarted", true, nil, b},
		{"restarted, a quota it does not fit stored meanwhile", true, []string{a + "max_gpus: 8\n"}, b},
		{"restarted, adopted twice", true, []string{a + "max_gpus: 20\n"}, a + "max_gpus: 20\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": a})
			store := func(spec string) {
				if _, err := specs.Put(context.Background(), "default", []byte(spec)); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
			stop := h.plannerWith(context.Background(), cfg)
			first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
			done := h.waitPublished("default", 1)
			store(b)
			h.waitReplans("default", done+1) // b replanned: adopted
			if tc.restart {
				stop()
			}
			for _, s := range tc.stored {
				store(s)
			}
			store(c)
			if tc.restart {
				stop = h.plannerWith(context.Background(), cfg)
			}
			defer stop()
			h.waitFor("default", "pending", func(p *planner.Plan) bool { return p.Revision > first.Revision })
			sp, err := h.plans().Latest(context.Background(), "default")
			if err != nil {
				t.Fatal(err)
			}
			next := sp.Plan
			if next.Revision != first.Revision+1 || !next.Valid() || next.PendingSpec == nil || next.Moved != 0 || next.Workers.Len() != first.Workers.Len() {
				t.Fatalf("revision %d (after %d): state %s, pending %+v, moved %d, %d workers; want the placement kept, c pending",
					next.Revision, first.Revision, next.PlanState(), next.PendingSpec, next.Moved, next.Workers.Len())
			}
			if want := digest(tc.follows); sp.PlacedFor != want {
				t.Fatalf("placed for %s, want %s (a %s, b %s)", sp.PlacedFor, want, digest(a), digest(b))
			}
		})
	}
}

// TestAdoptedAs: which put after a revision's spec is taken as adopted
// (adoptedAs): the newest differing from it in max_gpus alone, a quota
// the placement fits; nothing when a removal is among them.
func TestAdoptedAs(t *testing.T) {
	t.Parallel()
	const a = "scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\n"
	parse := func(s string) *planner.Spec {
		spec, err := planner.ParseSpec([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return spec
	}
	out := planner.PlanAll([]planner.Job{{Name: "p", Spec: parse(a)}}, []planner.Node{{ID: "n1", IP: "10.0.0.1", CPUs: 64, GPUs: 8}})
	placed := out[0].Plan
	if !placed.Valid() || planner.HeldGPUs(placed) != 4 {
		t.Fatalf("placed %s holding %d GPUs (error %q); want valid on 4", placed.PlanState(), planner.HeldGPUs(placed), placed.Error)
	}
	put := func(rev uint64, s string) memEntry {
		return memEntry{key: "p", value: []byte(s), rev: rev, op: jetstream.KeyValuePut}
	}
	for _, tc := range []struct {
		name  string
		later []memEntry
		want  uint64 // the revision taken; 0: a itself
	}{
		{"none", nil, 0},
		{"a quota it fits", []memEntry{put(2, a+"max_gpus: 4\n")}, 2},
		{"the newest of two", []memEntry{put(2, a+"max_gpus: 4\n"), put(3, a+"max_gpus: 6\n")}, 3},
		{"a quota it does not fit is passed over", []memEntry{put(2, a+"max_gpus: 4\n"), put(3, a+"max_gpus: 2\n")}, 2},
		{"more than the quota changed", []memEntry{put(2, a+"max_gpus: 4\npriority: 3\n")}, 0},
		{"a spec that does not parse is passed over", []memEntry{put(2, a+"max_gpus: 4\n"), put(3, "scheduling: [")}, 2},
		{"nothing after a removal", []memEntry{put(2, a+"max_gpus: 4\n"), {key: "p", rev: 3, op: jetstream.KeyValueDelete}, put(4, a+"max_gpus: 5\n")}, 0},
		{"nothing after a removal, the newest not adopted", []memEntry{{key: "p", rev: 2, op: jetstream.KeyValueDelete}, put(3, a+"max_gpus: 5\n"), put(4, a+"max_gpus: 2\n")}, 0},
		{"nothing before a removal", []memEntry{put(2, a+"max_gpus: 4\n"), {key: "p", rev: 3, op: jetstream.KeyValuePurge}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			later := make([]jetstream.KeyValueEntry, len(tc.later))
			for i, e := range tc.later {
				later[i] = e
			}
			spec, rev := adoptedAs(parse(a), placed, later)
			if rev != tc.want || (rev == 0) != (SpecDigest(spec) == SpecDigest(parse(a))) {
				t.Fatalf("revision %d (spec %s), want %d", rev, SpecDigest(spec), tc.want)
			}
		})
	}
}

// TestStandbySawRemovalAndPut: a standby whose spec watch delivered a
// removal and the put after it, both planned by the leader (the removal
// published, then a fresh placement), publishes neither again when it
// takes the lease: the removal it saw is its latest's to say.
func TestStandbySawRemovalAndPut(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	const a = "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"
	specs := h.cluster(4, map[string]string{"default": a})
	cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
	lead := h.instance("", cfg)
	h.waitRevision(1)
	standby := h.instance("", cfg)
	if h.waitLeader(5*time.Second, lead, standby) != lead {
		t.Fatal("the first planner does not lead")
	}
	if err := specs.Delete(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "removed", func(p *planner.Plan) bool { return p.Removed() })
	if _, err := specs.Put(context.Background(), "default", []byte(a)); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "placed again", func(p *planner.Plan) bool { return p.Revision == 3 && p.Valid() })
	standby.following(t, map[string]int{"default": 3})
	lead.stop()
	if h.waitLeader(10*time.Second, standby) != standby {
		t.Fatal("the standby does not lead")
	}
	standby.replanned(t, "default")
	if revs := h.mem.revisions("default"); len(revs) != 3 {
		t.Fatalf("revisions %v; want 1-3, the leader's, and none of the standby's", revs)
	}
}
