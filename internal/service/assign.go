package service

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// publishAssignments publishes the workers of every node of the change
// whose workers changed: an empty list for a node that lost them all.
// Each replaces only the message this planner knows its node's subject
// at (assignSeq): a planner deposed while it was paused between a
// revision and its assignments cannot overwrite the new leader's. A
// refusal leaves the subjects to the next reconcile, which reads them.
func (p *Planner) publishAssignments(ctx context.Context, prev, next *planner.Plan, change *plan.Change) error {
	was := func(string) []plan.Worker { return nil }
	if prev != nil && len(change.Nodes) > 0 {
		was = prev.NodeIndex()
	}
	var as []client.Assignment
	for _, nc := range change.Nodes {
		if old := was(nc.NodeID); len(old) == 0 && len(nc.Workers) == 0 || slices.EqualFunc(old, nc.Workers, planner.SameWorker) {
			continue
		}
		as = append(as, assignment(next, nc.NodeID, nc.Workers))
	}
	p.mu.Lock()
	for i := range as {
		as[i].Seq = p.assignSeq[as[i].NodeID]
	}
	p.mu.Unlock()
	return p.sendAssignments(ctx, as)
}

// sendAssignments publishes as, each replacing only the message at its
// Seq, and notes where each now is; refusals (a subject written by
// someone else since) call for a reconcile.
func (p *Planner) sendAssignments(ctx context.Context, as []client.Assignment) error {
	octx, done := p.op(ctx, fmt.Sprintf("publishing %d assignments of plan %s", len(as), p.cfg.Plan), p.storeTimeout(len(as)))
	refused, err := p.plans.PublishAssignments(octx, as, true)
	done()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range as {
		if a.Seq != 0 {
			p.assignSeq[a.NodeID] = a.Seq
		}
	}
	if refused > 0 {
		p.reconcile = true
		p.log.Warn().Int("nodes", refused).Msg("assignments written by another planner since; reconciling them with the latest plan")
	}
	return err
}

// noteAssignment records where a node's assignment was read.
func (p *Planner) noteAssignment(a *client.Assignment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.assignSeq[a.NodeID] = a.Seq
}

func assignment(p *planner.Plan, node string, ws []plan.Worker) client.Assignment {
	a := client.Assignment{Plan: p.Name, Revision: p.Revision, NodeID: node, Workers: make([]client.PlacedWorker, len(ws))}
	for i, w := range ws {
		a.Workers[i] = store.Place(p.Name, p.Revision, w)
	}
	return a
}

// stale is the assignment to publish for node when what its subject
// holds (have, nil when nothing) is not its workers in latest: nil when
// it is. It replaces only that message (Seq), so a newer one published
// meanwhile, by another planner, stays.
func stale(latest *planner.Plan, node string, want []plan.Worker, have *client.Assignment) *client.Assignment {
	var seq uint64
	if have != nil && have.Err == nil && have.Revision > latest.Revision {
		return nil // another planner's newer revision: this one is behind
	}
	if have != nil {
		seq = have.Seq
		ws := make([]plan.Worker, len(have.Workers))
		for i, pw := range have.Workers {
			ws[i] = pw.Worker
		}
		if have.Err == nil && slices.EqualFunc(ws, want, planner.SameWorker) {
			return nil
		}
	} else if len(want) == 0 {
		return nil
	}
	a := assignment(latest, node, want)
	a.Seq = seq
	return &a
}

// reconcileAssignments makes the assignment subjects match the latest
// plan when they may not (at start, after a publish that failed between
// the event and the assignments, after another planner's revision whose
// nodes are not known): it reads every node's last assignment and
// republishes those that differ or cannot be read. It waits while the
// latest is unreadable: that has no workers to go by.
func (p *Planner) reconcileAssignments(ctx context.Context) error {
	p.mu.Lock()
	need, latest := p.reconcile, p.latest
	p.mu.Unlock()
	if !need || latest == nil || latest.Unreadable {
		return nil
	}
	on := latest.Plan.NodeIndex()
	left := map[string]bool{}
	for _, w := range latest.Plan.Workers.All() {
		left[w.NodeID] = true
	}
	var as []client.Assignment
	octx, done := p.op(ctx, "reading plan "+p.cfg.Plan+"'s assignments", p.storeTimeout(len(left)+p.nodes()))
	err := p.plans.Client().Assignments(octx, p.cfg.Plan, func(a *client.Assignment) bool {
		p.noteAssignment(a)
		if s := stale(latest.Plan, a.NodeID, on(a.NodeID), a); s != nil {
			as = append(as, *s)
		}
		delete(left, a.NodeID)
		return true
	})
	done()
	if err != nil {
		return err
	}
	for node := range left {
		as = append(as, *stale(latest.Plan, node, on(node), nil))
	}
	if err := p.sendAssignments(ctx, as); err != nil {
		return err
	}
	if len(as) > 0 {
		p.log.Info().Int("nodes", len(as)).Int("revision", latest.Plan.Revision).Msg("assignments brought up to the latest plan")
	}
	p.mu.Lock()
	if p.latest == latest {
		p.reconcile = false
	}
	p.mu.Unlock()
	return nil
}

// adopted makes sp, another planner's revision, the latest (if newer)
// and notes what to check of its assignments (verifyAssignments): the
// nodes its event says changed, or, when it does not say (or sp is nil),
// every node.
func (p *Planner) adopted(sp *store.StoredPlan) {
	if p.adopt(sp) {
		// Outside p.mu: the gauges' lock comes first (leaderGauges).
		p.mu.Lock()
		latest := p.latest
		p.mu.Unlock()
		p.gauges(latest)
	}
}

// adopt is adopted but for the gauges; it reports whether sp became the
// latest.
func (p *Planner) adopt(sp *store.StoredPlan) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sp != nil {
		if p.latest != nil && sp.Plan.Revision <= p.latest.Plan.Revision {
			return false
		}
		p.latest = sp
		p.mark(sp.Plan.Revision)
	}
	if sp == nil || sp.Changed == nil {
		p.reconcile = true
		return sp != nil
	}
	if p.verify == nil {
		p.verify = map[string]bool{}
	}
	for _, n := range sp.Changed {
		p.verify[n] = true
	}
	return true
}

// checkAssignments is the check a moment after adopting another
// planner's revision: its nodes', or every node's.
func (p *Planner) checkAssignments(ctx context.Context) error {
	if err := p.verifyAssignments(ctx); err != nil {
		return err
	}
	return p.reconcileAssignments(ctx)
}

// verifyAssignments checks, a moment after this planner adopted another
// planner's revision, that the nodes that revision changed have their
// assignments: the other planner may have died between its event and
// them. It reads only those nodes' subjects; a revision that does not
// say which nodes changed is reconciled whole.
func (p *Planner) verifyAssignments(ctx context.Context) error {
	p.mu.Lock()
	nodes, latest := p.verify, p.latest
	p.verify = nil
	p.mu.Unlock()
	if len(nodes) == 0 || latest == nil || latest.Unreadable {
		return nil
	}
	if len(nodes) > verifyMax {
		p.adopted(nil) // one batched read of every node is cheaper
		return nil
	}
	on := latest.Plan.NodeIndex()
	c := p.plans.Client()
	var as []client.Assignment
	octx, done := p.op(ctx, "checking plan "+p.cfg.Plan+"'s assignments", p.storeTimeout(len(nodes)))
	defer done()
	for node := range nodes {
		have, err := c.Assignment(octx, p.cfg.Plan, node)
		switch {
		case errors.Is(err, client.ErrNotFound):
			have = nil
		case err == nil:
			p.noteAssignment(have)
		case errors.Is(err, client.ErrUnreadable):
			p.adopted(nil) // the whole reconcile replaces what it cannot read
			continue
		case err != nil:
			p.mu.Lock()
			p.verify = nodes // try again
			p.mu.Unlock()
			return err
		}
		if s := stale(latest.Plan, node, on(node), have); s != nil {
			as = append(as, *s)
		}
	}
	if len(as) > 0 {
		p.log.Warn().Int("nodes", len(as)).Int("revision", latest.Plan.Revision).
			Msg("another planner's revision left assignments behind; publishing them")
	}
	if err := p.sendAssignments(ctx, as); err != nil {
		p.adopted(nil) // not lost: the whole reconcile will do it
		return err
	}
	return nil
}

// verifyMax is how many nodes verifyAssignments reads one by one; more
// are reconciled in one batched read.
const verifyMax = 256

// checkPending says whether assignments wait to be checked.
func (p *Planner) checkPending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.verify) > 0 || p.reconcile
}
