package service

import (
	"context"
	"errors"
	"sync"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// storeSummary starts storing the summary of next, a snapshot revision
// published as the event at seq, for the readers that list plans
// (planner status, client.Summary): they read it, and the change events
// after it, instead of rebuilding the plan. Only snapshots get one (a
// change event carries its nodes whole, which is all a reader applies),
// so a node's loss costs no summary. It runs beside the assignments'
// publish, which it must not delay (10 to 20 ms to summarize 400,000
// workers), and wait waits for it. A summary not stored costs its
// readers a rebuild, never a wrong answer (they match it to the base's
// event by seq), so a failure is logged, not returned.
func (p *Service) storeSummary(ctx context.Context, s *planState, next *planner.Plan, seq uint64) (wait func()) {
	var wg sync.WaitGroup
	// Not p.op: the loop's record of what it waits on is a stack, kept
	// by the loop's goroutine alone.
	ctx, cancel := context.WithTimeout(ctx, p.storeTimeout(0))
	log := s.log
	wg.Go(func() {
		sum := plan.SummaryOf(&next.Document, seq)
		if err := p.plans.PutSummary(ctx, sum); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn().Err(err).Int("revision", next.Revision).Msg("storing the plan's summary failed: planner status rebuilds the plan instead")
		}
	})
	return func() {
		wg.Wait()
		cancel()
	}
}
