package service

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/api"
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
func (p *Service) publishAssignments(ctx context.Context, s *planState, prev, next *planner.Plan, change *plan.Change) error {
	out := assignmentSender{p: p, s: s}
	for a := range changedAssignmentsInto(prev, next, change, out.workers) {
		a.Seq = s.assignSeq[a.NodeID]
		if err := out.add(ctx, a); err != nil {
			s.refusedAssignments(out.refused)
			return err
		}
	}
	return out.done(ctx)
}

// changedAssignments yields, in node order, the assignment of each node
// of the change whose workers changed, with its workers in next. A nil
// change is a first revision's (prev nil): every node next places
// workers on, read from next one node at a time rather than copied
// whole into a change first.
func changedAssignments(prev, next *planner.Plan, change *plan.Change) iter.Seq[client.Assignment] {
	return changedAssignmentsInto(prev, next, change, func(n int) []client.PlacedWorker { return make([]client.PlacedWorker, 0, n) })
}

// changedAssignmentsInto is changedAssignments with a first revision's
// worker lists from workers (an empty list with room for n).
func changedAssignmentsInto(prev, next *planner.Plan, change *plan.Change, workers func(n int) []client.PlacedWorker) iter.Seq[client.Assignment] {
	return func(yield func(client.Assignment) bool) {
		if change == nil {
			var on func(string) []plan.Worker
			for _, id := range placedNodes(next) {
				a := client.Assignment{Plan: next.Name, Revision: next.Revision, NodeID: id}
				// Counted first, so that each node's list is made once, not
				// grown through four arrays left as garbage (some 100 MB
				// at 20,000 nodes, while the first revision's heap peaks).
				n := 0
				if next.EachOnNode(id, func(*plan.Worker) { n++ }) {
					a.Workers = workers(n)
					next.EachOnNode(id, func(w *plan.Worker) { a.Workers = append(a.Workers, api.Place(next.Name, next.Revision, *w)) })
				} else {
					if on == nil {
						on = next.NodeIndex()
					}
					a = assignment(next, id, on(id))
				}
				if len(a.Workers) > 0 && !yield(a) {
					return
				}
			}
			return
		}
		was := func(string) []plan.Worker { return nil }
		if prev != nil && len(change.Nodes) > 0 {
			was = prev.NodeIndex()
		}
		for _, nc := range change.Nodes {
			if old := was(nc.NodeID); len(old) == 0 && len(nc.Workers) == 0 || slices.EqualFunc(old, nc.Workers, planner.SameWorker) {
				continue
			}
			if !yield(assignment(next, nc.NodeID, nc.Workers)) {
				return
			}
		}
	}
}

// placedNodes lists, sorted, the nodes p places a worker on.
func placedNodes(p *planner.Plan) []string {
	seen := map[string]bool{}
	var ids []string
	for _, w := range p.Workers.All() {
		if !seen[w.NodeID] {
			seen[w.NodeID] = true
			ids = append(ids, w.NodeID)
		}
	}
	slices.Sort(ids)
	return ids
}

// assignBatch is how many assignments are built before they are sent:
// a first revision's 20,000 nodes are not all held built (their workers
// copied once more) at once.
const assignBatch = 1024

// assignmentSender sends assignments in batches of assignBatch, and
// says once, at the end, how many were refused.
type assignmentSender struct {
	p       *Service
	s       *planState
	batch   []client.Assignment
	refused int
	// spare are the worker lists of the assignments sent, which nothing
	// holds once they are (the plan store copies what it publishes): the
	// next batch's are written into them, not into 20,000 lists of ~3 KB
	// made and dropped while a first revision's heap is at its largest.
	spare [][]client.PlacedWorker
}

// workers is an empty worker list with room for n, a spare one if it
// has the room.
func (o *assignmentSender) workers(n int) []client.PlacedWorker {
	if k := len(o.spare); k > 0 {
		ws := o.spare[k-1]
		o.spare = o.spare[:k-1]
		if cap(ws) >= n {
			return ws[:0]
		}
	}
	return make([]client.PlacedWorker, 0, n)
}

func (o *assignmentSender) add(ctx context.Context, a client.Assignment) error {
	o.batch = append(o.batch, a)
	if len(o.batch) < assignBatch {
		return nil
	}
	return o.flush(ctx)
}

func (o *assignmentSender) flush(ctx context.Context) error {
	if len(o.batch) == 0 {
		return nil
	}
	refused, err := o.p.sendBatch(ctx, o.s, o.batch)
	o.refused += refused
	for i := range o.batch {
		if ws := o.batch[i].Workers; cap(ws) > 0 {
			o.spare = append(o.spare, ws[:0])
		}
	}
	// The next batch reuses the slice, and the worker lists.
	clear(o.batch)
	o.batch = o.batch[:0]
	return err
}

// done sends what is left and notes the refusals (a subject written by
// someone else since), which call for a reconcile.
func (o *assignmentSender) done(ctx context.Context) error {
	err := o.flush(ctx)
	o.s.refusedAssignments(o.refused)
	return err
}

// sendAssignments publishes as, each replacing only the message at its
// Seq, and notes where each now is; refusals (a subject written by
// someone else since) call for a reconcile.
func (p *Service) sendAssignments(ctx context.Context, s *planState, as []client.Assignment) error {
	refused, err := p.sendBatch(ctx, s, as)
	s.refusedAssignments(refused)
	return err
}

// sendBatch publishes as and notes where each now is; it says how many
// were refused.
func (p *Service) sendBatch(ctx context.Context, s *planState, as []client.Assignment) (int, error) {
	octx, done := p.op(ctx, fmt.Sprintf("publishing %d assignments of plan %s", len(as), s.name), p.storeTimeout(len(as)))
	refused, err := p.plans.PublishAssignments(octx, as, true)
	done()
	for _, a := range as {
		if a.Seq != 0 {
			s.assignSeq[a.NodeID] = a.Seq
		}
	}
	return refused, err
}

// refusedAssignments takes n assignments refused as written by someone
// else since: a reconcile reads them.
func (s *planState) refusedAssignments(n int) {
	if n > 0 {
		s.reconcile = true
		s.log.Warn().Int("nodes", n).Msg("assignments written by another planner since; reconciling them with the latest plan")
	}
}

// noteAssignment records where a node's assignment was read.
func (p *Service) noteAssignment(s *planState, a *client.Assignment) {
	s.assignSeq[a.NodeID] = a.Seq
}

func assignment(p *planner.Plan, node string, ws []plan.Worker) client.Assignment {
	a := client.Assignment{Plan: p.Name, Revision: p.Revision, NodeID: node, Workers: make([]client.PlacedWorker, len(ws))}
	for i, w := range ws {
		a.Workers[i] = api.Place(p.Name, p.Revision, w)
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
		// Compared in place: a restart reconciles every node's, and a
		// copy of each node's workers was 50 MB of garbage at 20,000.
		if have.Err == nil && slices.EqualFunc(have.Workers, want, func(pw client.PlacedWorker, w plan.Worker) bool { return planner.SameWorker(pw.Worker, w) }) {
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
func (p *loopState) reconcileAssignments(ctx context.Context, s *planState) error {
	need, latest := s.reconcile, s.latest
	if !need || latest == nil || latest.Unreadable {
		return nil
	}
	on := latest.Plan.NodeIndex()
	left := map[string]bool{}
	for _, w := range latest.Plan.Workers.All() {
		left[w.NodeID] = true
	}
	var as []client.Assignment
	octx, done := p.op(ctx, "reading plan "+s.name+"'s assignments", p.storeTimeout(len(left)+p.nodes()))
	err := p.plans.Assignments(octx, s.name, func(a *client.Assignment) bool {
		p.noteAssignment(s, a)
		if st := stale(latest.Plan, a.NodeID, on(a.NodeID), a); st != nil {
			as = append(as, *st)
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
	if err := p.sendAssignments(ctx, s, as); err != nil {
		return err
	}
	if len(as) > 0 {
		s.log.Info().Int("nodes", len(as)).Int("revision", latest.Plan.Revision).Msg("assignments brought up to the latest plan")
	}
	if s.latest == latest {
		s.reconcile = false
	}
	return nil
}

// adopted makes sp, another planner's revision, the latest (if newer)
// and notes what to check of its assignments (verifyAssignments): the
// nodes its event says changed, or, when it does not say (or sp is nil),
// every node.
func (p *loopState) adopted(s *planState, sp *store.StoredPlan) {
	if p.adopt(s, sp) {
		p.gauges(s, s.latest)
		p.publishSnapshot(true)
	}
}

// adopt is adopted but for the gauges; it reports whether sp became the
// latest.
func (p *Service) adopt(s *planState, sp *store.StoredPlan) bool {
	if sp != nil {
		if s.latest != nil && sp.Plan.Revision <= s.latest.Plan.Revision {
			return false
		}
		s.latest = sp
		p.mark(s, sp.Plan.Revision)
		p.keepPlacement(s, sp)
	}
	if sp == nil || sp.Changed == nil {
		s.reconcile = true
		return sp != nil
	}
	if s.verify == nil {
		s.verify = map[string]bool{}
	}
	for _, n := range sp.Changed {
		s.verify[n] = true
	}
	return true
}

// checkAssignments is the check a moment after adopting another
// planner's revision: its nodes', or every node's.
func (p *loopState) checkAssignments(ctx context.Context, s *planState) error {
	if err := p.verifyAssignments(ctx, s); err != nil {
		return err
	}
	return p.reconcileAssignments(ctx, s)
}

// verifyAssignments checks, a moment after this planner adopted another
// planner's revision, that the nodes that revision changed have their
// assignments: the other planner may have died between its event and
// them. It reads only those nodes' subjects; a revision that does not
// say which nodes changed is reconciled whole.
func (p *loopState) verifyAssignments(ctx context.Context, s *planState) error {
	nodes, latest := s.verify, s.latest
	s.verify = nil
	if len(nodes) == 0 || latest == nil || latest.Unreadable {
		return nil
	}
	if len(nodes) > verifyMax {
		p.adopted(s, nil) // one batched read of every node is cheaper
		return nil
	}
	on := latest.Plan.NodeIndex()
	var as []client.Assignment
	octx, done := p.op(ctx, "checking plan "+s.name+"'s assignments", p.storeTimeout(len(nodes)))
	defer done()
	for node := range nodes {
		have, err := p.plans.Assignment(octx, s.name, node)
		switch {
		case errors.Is(err, client.ErrNotFound):
			have = nil
		case err == nil:
			p.noteAssignment(s, have)
		case errors.Is(err, client.ErrUnreadable):
			p.adopted(s, nil) // the whole reconcile replaces what it cannot read
			continue
		case err != nil:
			s.verify = nodes // try again
			return err
		}
		if st := stale(latest.Plan, node, on(node), have); st != nil {
			as = append(as, *st)
		}
	}
	if len(as) > 0 {
		s.log.Warn().Int("nodes", len(as)).Int("revision", latest.Plan.Revision).
			Msg("another planner's revision left assignments behind; publishing them")
	}
	if err := p.sendAssignments(ctx, s, as); err != nil {
		p.adopted(s, nil) // not lost: the whole reconcile will do it
		return err
	}
	return nil
}

// verifyMax is how many nodes verifyAssignments reads one by one; more
// are reconciled in one batched read.
const verifyMax = 256

// checkPending says whether any plan's assignments wait to be checked.
func (p *loopState) checkPending() bool {
	for _, s := range p.states {
		if len(s.verify) > 0 || s.reconcile {
			return true
		}
	}
	return false
}
