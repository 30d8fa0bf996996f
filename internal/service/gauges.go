package service

import "github.com/poolplanner/poolplanner/internal/store"

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
	if pl.Removed {
		p.cfg.Metrics.Removed(s.name)
		return
	}
	p.cfg.Metrics.Published(s.name, pl.Revision, pl.Valid, pl.Workers.Len(), gpusHeld(pl), 0)
	p.cfg.Metrics.Shared(s.name, pl.Priority, len(pl.PreemptedBy) > 0)
}

// leaderGauges sets the leader gauge of every plan the loop plans: 1
// while this planner leads (Service.leads), else 0. The loop's
// goroutine calls it.
func (p *Service) leaderGauges() {
	if p.cfg.Metrics == nil {
		return
	}
	leading := p.leads()
	for _, s := range p.planned() {
		p.cfg.Metrics.Leading(s.name, leading)
	}
}

// notLeadingGauges sets the leader gauge of every plan the loop's
// snapshot says it plans to 0: the leaser calls it as it steps down,
// whatever the loop is doing (the gauges are safe from any goroutine).
func (p *Service) notLeadingGauges() {
	if p.cfg.Metrics == nil {
		return
	}
	for _, v := range p.view().planned() {
		p.cfg.Metrics.Leading(v.name, false)
	}
}
