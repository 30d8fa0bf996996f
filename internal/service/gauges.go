package service

import (
	"sync"

	"github.com/poolplanner/poolplanner/internal/store"
)

// A plan's gauges (revision, valid, workers, GPUs, priority, preempted)
// say its latest revision, whoever published it: set when this planner
// publishes one, adopts another planner's, and reads the latest at
// start or when a spec appears (so that a restarted planner's metrics
// show every plan before any new revision). Whether this planner leads
// is one lease for every plan: each plan it plans has the leader gauge,
// 1 or 0 alike. A removed plan's series all end.

// gauges sets the plan's gauges from sp, its latest revision: nothing
// for none, or for a stand-in whose placement is not known (aboveMark);
// a revision that says the plan was removed ends its series.
func (p *Service) gauges(s *planState, sp *store.StoredPlan) {
	if sp == nil || sp.Unreadable || sp.Plan == nil {
		return
	}
	pl := sp.Plan
	if pl.Removed() {
		p.leader.ended(p, s.name)
		return
	}
	p.cfg.Metrics.Published(s.name, pl.Revision, pl.Valid(), pl.Workers.Len(), s.heldShares(nil, pl), 0)
	p.cfg.Metrics.Shared(s.name, pl.Priority, len(pl.PreemptedBy) > 0)
	elasticMetrics(p.cfg.Metrics, pl, false)
}

// leaderGauge keeps the leader gauges of the plans this planner has
// set them for. The loop sets them (leaderGauges) and ends a removed
// plan's series (ended); the leaser clears them as it steps down
// (notLeading), whatever the loop is doing. mu makes each of these one
// step: a plan whose series ended is not given a leader gauge again by a
// step-down reading an older list, and the loop's "leading" cannot land
// after a step-down's "not leading" from a leads() read before it.
// Taken after fence.mu, before the innermost locks (Service).
type leaderGauge struct {
	mu     sync.Mutex
	gauged map[string]bool
}

// leaderGauges sets the leader gauge of every plan the loop plans: 1
// while this planner leads (Service.leads), else 0. The loop's
// goroutine calls it.
func (p *loopState) leaderGauges() {
	if p.cfg.Metrics == nil {
		return
	}
	g := &p.leader
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gauged == nil {
		g.gauged = map[string]bool{}
	}
	leading := p.leads()
	for _, s := range p.planned() {
		p.cfg.Metrics.Leading(s.name, leading)
		g.gauged[s.name] = true
	}
}

// ended ends plan name's series (a removed plan's): the loop's goroutine
// calls it.
func (g *leaderGauge) ended(p *Service, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.gauged, name)
	p.cfg.Metrics.Removed(name)
}

// notLeadingGauges sets the leader gauge of every plan that has one to
// 0: the leaser calls it as it steps down (the gauges are safe from any
// goroutine).
func (p *Service) notLeadingGauges() {
	if p.cfg.Metrics == nil {
		return
	}
	g := &p.leader
	g.mu.Lock()
	defer g.mu.Unlock()
	for name := range g.gauged {
		p.cfg.Metrics.Leading(name, false)
	}
}
