package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/planner"
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
// spec's history: by the latest revision's digest, or, pending, the
// newest before it the document was placed for), checked against the
// inventory as one that kept running does: a worker whose node went
// while no planner ran is re-placed, not kept there as valid.
func TestRestartFollowsStoredSpec(t *testing.T) {
	t.Parallel()
	for _, pendingFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("pending before the restart %v", pendingFirst), func(t *testing.T) {
			t.Parallel()
			h := newMemHarness(t)
			specs := h.cluster(4, map[string]string{"default": "scheduling:\n  train: {worker_num: 16, num_cpus: 1, num_gpus: 1}\n"})
			put := func(train int) {
				if _, err := specs.Put(context.Background(), "default", []byte(fmt.Sprintf("scheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\n", train))); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Config{Debounce: 50 * time.Millisecond, Settle: -1}
			stop := h.plannerWith(context.Background(), cfg)
			first := h.waitFor("default", "a valid plan", func(p *planner.Plan) bool { return p.Valid() })
			if pendingFirst {
				put(64)
				first = h.waitFor("default", "the new spec pending", func(p *planner.Plan) bool { return p.PendingSpec != nil })
				put(48) // pending too: the spec it follows is two back
				first = h.waitFor("default", "the newer spec pending", func(p *planner.Plan) bool {
					return p.PendingSpec != nil && strings.Contains(p.PendingSpec.Reason, "required 48")
				})
			}
			stop()
			if !pendingFirst {
				put(64)
			}
			gone := first.Workers.At(0).NodeID
			h.kill(gone)
			stop = h.plannerWith(context.Background(), cfg)
			defer stop()
			next := h.waitFor("default", "the new spec pending", func(p *planner.Plan) bool { return p.Revision > first.Revision && p.PendingSpec != nil })
			if !next.Valid() || next.Workers.Len() != first.Workers.Len() {
				t.Fatalf("state %s, %d workers (had %d); want them kept valid on the spec in force", next.PlanState(), next.Workers.Len(), first.Workers.Len())
			}
			for _, w := range next.Workers.All() {
				if w.NodeID == gone {
					t.Fatalf("%s %d kept on %s, gone while no planner ran", w.Component, w.Index, gone)
				}
			}
		})
	}
}
