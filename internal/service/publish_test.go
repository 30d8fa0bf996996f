package service

import (
	"context"
	"fmt"
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
