package service

import (
	"context"
	"errors"
	"sync"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// storeSummary starts storing the summary of next, published as the
// event at seq, for the readers that list plans (planner status,
// client.Summary): they read it instead of rebuilding a plan whose event
// does not carry it whole (kind "change" or "snapshot"). It runs beside
// the assignments' publish, which it must not delay (10 ms to summarize
// 400,000 workers), and wait waits for it. A summary not stored costs
// its readers a rebuild, never a wrong answer (they match it to the
// latest event by seq), so a failure is logged, not returned.
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
