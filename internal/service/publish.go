package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// maxChange bounds an event's body (or the server's max_payload, where
// smaller): a larger change makes the revision a snapshot.
const maxChange = 512 << 10

// afterFirstSync starts the change log from the plan found at start: the
// first watch filled the inventory, which is no change; the nodes of that
// plan that are not there left.
func (p *loopState) afterFirstSync(s *planState) {
	clear(s.basis)
	if s.latest == nil {
		return
	}
	for _, pl := range s.latest.Plan.Pools {
		for _, n := range pl.Nodes.All() {
			if _, ok := p.live.doc(n.NodeID); !ok {
				s.basis[n.NodeID] = &inventory.NodeInventory{NodeID: n.NodeID}
			}
		}
	}
}

// replan plans every plan of the loop together (planner.PlanAll: no
// GPU to two plans, lower priorities giving way) and publishes each that
// changed: its event, then the assignments of the nodes whose workers
// changed; a removed plan's last revision releases its workers. The
// publishes follow planner.PublishOrder: a GPU is published as taken only after
// the revision that gives it up, and a cycle of plans taking from each
// other is broken by a release step (order.go). On a conflict (another
// planner published first) it re-reads that plan's latest and plans
// again.
func (p *loopState) replan(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := p.replanOnce(ctx)
		var c *conflict
		if !errors.As(err, &c) {
			return err
		}
		if attempt >= maxConflicts {
			return c.err
		}
		octx, done := p.op(ctx, "reading plan "+c.state.name+"'s latest revision", p.readTimeout(c.state))
		sp, err := p.plans.Latest(octx, c.state.name)
		done()
		if err != nil {
			return err
		}
		p.adopted(c.state, sp)
	}
}

// conflict is a publish of state's plan refused because another planner
// published first.
type conflict struct {
	state *planState
	err   error
}

func (c *conflict) Error() string { return c.err.Error() }
func (c *conflict) Unwrap() error { return c.err }

// replanOnce is one try of replan.
func (p *loopState) replanOnce(ctx context.Context) error {
	states := p.planned()
	for _, s := range states {
		if err := p.load(ctx, s); err != nil {
			return err
		}
		if err := p.reconcileAssignments(ctx, s); err != nil {
			return err
		}
	}
	p.refreshOut()
	nodes := p.live.planNodes()
	jobs, planned, err := p.releaseRemoved(ctx, states)
	if err != nil {
		return err
	}
	// Planning takes time in the workers placed as well as the nodes.
	done := p.allow("planning", p.storeTimeout(len(nodes)+p.workersOf(states...)/8))
	outs := planner.PlanAllWith(jobs, nodes, p.grow.options(p.clock.Now(), p.cfg.GrowAfter))
	done()
	changing := make([]bool, len(planned))
	for i, s := range planned {
		changing[i] = s != nil
	}
	held, next, touched := planner.Holdings(jobs, outs, changing)
	changes := make([][]string, len(jobs))
	for i, s := range planned {
		if s != nil {
			changes[i] = s.changes(&p.live)
		}
	}
	p.noteDrains(planned, outs, changes)
	released := make([]bool, len(jobs))
	for _, st := range planner.PublishOrder(held, next) {
		i := st.Plan
		s := planned[i]
		if s == nil {
			continue // held as it was
		}
		var err error
		switch {
		case st.Release:
			err = p.publishRelease(ctx, s, outs[i].Plan, held[i], touched, planner.Takers(jobs, held, next, i), changes[i])
			released[i] = err == nil
		case released[i]:
			// Moves counted from the release step, which placed some.
			if latest := p.latestPlan(s); latest != nil {
				outs[i].Plan.Moved = planner.CountMoved(latest, outs[i].Plan)
			}
			fallthrough
		default:
			err = p.publishNext(ctx, s, outs[i], changes[i])
		}
		p.beat()
		if err != nil {
			return conflicted(s, err)
		}
	}
	// Only once every revision is out: a growth not published holds
	// nothing, and its GPUs, free all along, are grown onto at the retry
	// without another grow-after.
	p.grow.note(p.clock.Now(), p.cfg.GrowAfter, jobs, outs, nodes)
	// Still to do when the latest was unreadable before.
	for _, s := range states {
		if err := p.reconcileAssignments(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// releaseRemoved publishes the last revision of each removed plan, and
// returns the others as PlanAll's jobs, each with its state (nil for a
// plan held as it is).
func (p *loopState) releaseRemoved(ctx context.Context, states []*planState) ([]planner.Job, []*planState, error) {
	var jobs []planner.Job
	var planned []*planState
	for _, s := range states {
		p.checkRenumbered(ctx, s)
		spec, removing := s.spec, s.removing
		hold := false
		switch {
		case removing && s.plannedAfterRemoval():
			// The latest was planned on a put after this removal (by
			// another planner; this one's spec watch is behind): the put
			// is still to come, and the placement is kept till then.
			hold = true
		case removing:
			if err := p.publishRemoved(ctx, s); err != nil {
				return nil, nil, conflicted(s, err)
			}
			continue
		case spec != nil, s.recordLost == "":
			// Asked also with no spec that parses: one stored after a
			// removal while no planner ran (no good spec since it:
			// lastGoodSpec) leaves the removed spec's placement to
			// release, and nothing to plan. (Not of a record the server
			// cannot read: its history is as damaged, its placement
			// held as it is.)
			switch p.removedSince(ctx, s) {
			case removalSince:
				// Released as by a planner that ran through the removal,
				// then planned afresh on the latest that says so (if it
				// has a spec that parses).
				on := specOn{digest: s.latest.SpecDigest, rev: s.latestSpecRev()}
				if err := p.publishRemoval(ctx, s, on); err != nil {
					return nil, nil, conflicted(s, err)
				}
				s.removedAt = 0
				s.inherited = nil // none of its nodes is waited for: it holds none
			case removalUnknown:
				// Planned on the new spec, it would carry that spec's
				// revision, and the removal, if any, would never be
				// told again: held as it is until the history can be
				// read (followedRetry).
				hold = true
			}
		}
		latest, age := s.latest, s.age
		var prev *planner.Plan
		if latest != nil {
			prev = latest.Plan
		}
		if spec == nil || hold {
			// None that parses, or one not to plan yet: its last valid
			// revision stays as it is, and no other plan takes its GPUs.
			if prev != nil && prev.Placed() {
				jobs = append(jobs, planner.Job{Name: s.name, Prev: prev, Age: age})
				planned = append(planned, nil)
			}
			continue
		}
		job := planner.Job{Name: s.name, Spec: spec, Prev: prev, Age: age}
		if job.FollowsUnknown() {
			job.PrevSpec = p.followedSpec(ctx, s)
		}
		jobs = append(jobs, job)
		planned = append(planned, s)
	}
	return jobs, planned, nil
}

// plannedAfterRemoval says whether s's latest revision was planned on a
// spec stored after the removal marker the spec watch delivered last
// (planState.removedAt): a removal that revision's planner saw already.
// Either not known (0): not. (A spec bucket recreated since the latest
// was planned numbers from 1 again: its spec revision is not known then,
// checkRenumbered.)
func (s *planState) plannedAfterRemoval() bool {
	l, rev := s.latest, s.latestSpecRev()
	return l != nil && !l.Plan.Removed() && rev != 0 && s.removedAt != 0 && rev > s.removedAt
}

// latestSpecRev is s's latest's spec revision (client.SpecRevisionHeader),
// 0 where not known: none said, or one of a spec bucket made again since
// (checkRenumbered).
func (s *planState) latestSpecRev() uint64 {
	if s.latest == nil || s.latest == s.renumberedFor {
		return 0
	}
	return s.latest.SpecRevision
}

// checkRenumbered notes (planState.renumberedFor) a latest planned on a
// spec bucket since made again, whose revisions number from 1 again
// (the bucket lost and restored, the spec put back): a removal there
// below the latest's spec revision would be held for ever as one the
// latest's planner saw (plannedAfterRemoval), a put after it taken as
// planned on. A spec or removal the watch delivered below the latest's
// spec revision is also a watch behind the plan stream (a standby), so
// the key's history tells: in the bucket the latest was planned on, the
// key has an entry at its spec revision or after (a purge, a delete, 64
// puts since leave newer ones); one whose newest entry is below it is
// of another bucket. Then the latest's spec revision is not known, and
// its removal is told by its digest, as for a revision from before
// planners said it. A history that cannot be read tells nothing (the
// removal held, the safer way to be wrong) and is asked again a moment
// later (followedRetry).
func (p *loopState) checkRenumbered(ctx context.Context, s *planState) {
	l := s.latest
	if l == nil || l.SpecRevision == 0 || l == s.renumberedFor || l.Plan.Removed() || l.Orphan || l.Unreadable {
		return
	}
	if !(s.specRev != 0 && s.specRev < l.SpecRevision) && !(s.removedAt != 0 && s.removedAt < l.SpecRevision) {
		return
	}
	key := renumberKey{latest: l, specRev: s.specRev, removedAt: s.removedAt}
	if s.renumberAsked == key {
		return
	}
	hist, err := p.specHistory(ctx, s.name)
	if err != nil {
		p.followedRetry = true
		return
	}
	s.renumberAsked = key
	if len(hist) == 0 || hist[len(hist)-1].Revision() >= l.SpecRevision {
		return
	}
	s.log.Info().Int("revision", l.Plan.Revision).Uint64("spec_revision", l.SpecRevision).Uint64("newest", hist[len(hist)-1].Revision()).
		Msg("the spec bucket was made again since the latest revision was planned (the key's revisions are all below the latest's): its spec revision is not known, a removal is told by its digest")
	s.renumberedFor = l
}

// removal is what removedSince tells of a latest revision.
type removal int

const (
	// removalNone: no removal known since its spec; it is planned on.
	removalNone removal = iota
	// removalSince: removed since its spec, and stored again.
	removalSince
	// removalUnknown: the history, needed to tell, cannot be read now.
	removalUnknown
)

// removedSince says whether s's spec was removed after the spec its
// latest revision was planned on, and stored again: a removal the spec
// watch delivered (planState.removedAt), or one while no planner ran,
// which the watch, delivering a key's last value, never shows. That one
// is read from the spec's history, once per latest revision read back:
// a removal marker (delete or purge) after the revision's spec revision
// (client.SpecRevisionHeader), or, for a revision from before planners
// said it, after the newest put of its digest. Not known (the placement
// kept, as before): a history that no longer holds the removal
// (bus.SpecHistory entries, the markers among them), or no put of the
// digest in it (a digest of an older planner's build may match none:
// a removal long before it, released then, is not this one's).
// A history that cannot be read is removalUnknown (logged once, asked
// again a moment later: followedRetry).
func (p *loopState) removedSince(ctx context.Context, s *planState) removal {
	latest, specRev := s.latest, s.latestSpecRev()
	if latest == nil || latest.Plan.Removed() || latest.Orphan || latest.Unreadable {
		// Nothing to release, or nothing known of the spec it followed.
		s.removedAt = 0
		return removalNone
	}
	if s.removedAt != 0 && specRev != 0 {
		// The marker is known: the removal is after the revision's
		// spec, or was seen by the planner that published it.
		if specRev < s.removedAt {
			return removalSince
		}
		s.removedAt = 0
	}
	if s.removedAt == 0 {
		// (A removal the watch delivered to a revision that does not
		// say its spec revision is told from the history, below.)
		switch {
		case s.removalChecked == latest:
			return removalNone
		case specRev != 0 && s.specRev != 0 && specRev >= s.specRev,
			specRev == 0 && latest.SpecDigest == s.digest:
			// Planned on the spec in force: no removal after it. (One
			// from before the header, on a spec of the same digest,
			// cannot be told from one planned on it after: kept, as
			// before.)
			s.removalChecked = latest
			return removalNone
		}
	}
	hist, err := p.specHistory(ctx, s.name)
	if err != nil {
		p.historyUnread(s, latest, err, "to tell whether the spec was removed since the latest revision")
		return removalUnknown
	}
	// The newest removal after the revision's spec; for a revision that
	// does not say its spec revision, after the newest put of its
	// digest, and none where no put of it is there (which removal, if
	// any, came after it is not known).
	var marker uint64
	if specRev != 0 {
		marker = newestRemoval(hist, specRev, 0)
	} else {
		for i := len(hist) - 1; i >= 0; i-- {
			if hist[i].Operation() != jetstream.KeyValuePut {
				continue
			}
			if spec, err := planner.ParseSpec(hist[i].Value()); err == nil && SpecDigest(spec) == latest.SpecDigest {
				marker = newestRemoval(hist[i:], hist[i].Revision(), 0)
				break
			}
		}
	}
	if marker == 0 {
		s.removalChecked, s.removedAt = latest, 0
		return removalNone
	}
	// Neither the check nor removedAt is noted till the removal is out
	// (releaseRemoved): a publish that fails (a timeout, the lease lost
	// and taken again) would otherwise leave the next replan to plan the
	// new spec on the old placement, the removal never told again.
	s.log.Info().Int("revision", latest.Plan.Revision).Uint64("removed_at", marker).
		Msg("spec removed and stored again since the latest revision: releasing the plan's workers, then placing it afresh")
	return removalSince
}

// followedSpec is the spec s's latest revision's placement follows, as
// the spec bucket's history holds it: the spec of the digest the
// revision was published on, or, where its spec is pending, of the one
// it says its placement follows (client.PlacedForHeader). The planner
// asks for it where the document does not say (Job.FollowsUnknown: read
// back at a restart or from another planner, the spec changed since or
// pending): without it the placement would be kept unchecked, a worker
// on a node gone while no planner ran kept in a valid revision. nil
// where the digest is not known (a revision from before planners said
// it) or the history no longer holds it; a history that cannot be read
// is logged once and asked again by a replan a moment later
// (loopState.followedRetry).
func (p *loopState) followedSpec(ctx context.Context, s *planState) *planner.Spec {
	latest := s.latest
	digest := latest.SpecDigest
	if latest.Plan.PendingSpec != nil {
		digest = latest.PlacedFor
	}
	switch {
	case digest == "":
		return nil
	case digest == s.digest:
		return s.spec
	case s.followedFor == latest && s.followedDigest == digest:
		return s.followed
	}
	// A pending revision's placement follows the spec it names; any
	// other's, maybe one adopted since it was published.
	var adopting *planner.Plan
	if latest.Plan.PendingSpec == nil {
		adopting = latest.Plan
	}
	spec, adoptedRev, err := p.specOfDigest(ctx, s.name, digest, adopting)
	if err != nil {
		p.historyUnread(s, latest, err, "for the spec the latest revision followed")
		return nil
	}
	if adoptedRev != 0 {
		// Held as the planner that adopted it held it (adoptSpec), so
		// that the next revision says its placement follows this spec
		// (Poolplanner-Placed-For), as that planner's would.
		adopted := *latest
		adopted.SpecDigest, adopted.SpecRevision = SpecDigest(spec), adoptedRev
		if s.removalChecked == latest {
			s.removalChecked = &adopted
		}
		s.latest, latest, digest = &adopted, &adopted, adopted.SpecDigest
	}
	s.followedFor, s.followedDigest, s.followed = latest, digest, spec
	return spec
}

// historyUnread notes that plan s's spec history, needed (why) for
// revision latest's placement, could not be read: the replan is tried
// again (followedRetry) and the placement kept meanwhile, said once per
// latest revision.
func (p *loopState) historyUnread(s *planState, latest *store.StoredPlan, err error, why string) {
	p.followedRetry = true
	if s.followedSaid != latest {
		s.followedSaid = latest
		s.log.Warn().Err(err).Int("revision", latest.Plan.Revision).
			Msg("cannot read the spec's history " + why + "; its placement is kept as it is until it can")
	}
}

// followedRetryAfter is how soon a replan that could not read a spec
// history it needed is tried again.
const followedRetryAfter = 2 * time.Second

// specOfDigest is the newest spec of plan name's history whose digest
// is digest (nil: none there), or, with adopting (the placement of a
// revision published on it), the newest put after it that adopted that
// placement (adoptedAs) and its revision (0: spec itself).
func (p *loopState) specOfDigest(ctx context.Context, name, digest string, adopting *planner.Plan) (*planner.Spec, uint64, error) {
	// "Not found" of a plan's key being planned is a replica behind
	// (specHistory): an error, asked again, not a history without it.
	hist, err := p.specHistory(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Operation() != jetstream.KeyValuePut {
			// A removal after the revision's spec was released and
			// planned afresh before its spec is looked up
			// (removedSince); one it could not tell (no
			// Poolplanner-Spec-Revision, the same digest stored again)
			// is looked past, the placement checked on that spec still.
			continue
		}
		if spec, err := planner.ParseSpec(hist[i].Value()); err == nil && SpecDigest(spec) == digest {
			if adopting != nil {
				adopted, rev := adoptedAs(spec, adopting, hist[i+1:])
				return adopted, rev, nil
			}
			return spec, 0, nil
		}
	}
	return nil, 0, nil
}

// adoptedAs is the spec a placement published on spec follows, given
// the puts stored after spec (later, the newest last): the newest of
// them that a planner would have adopted (published nothing for, the
// placement the same: Service.adoptSpec), else spec. An adoption is
// stored nowhere, so that a steady cluster publishes nothing; the
// spec's history is its record, read only when a restarted planner
// needs it (Job.FollowsUnknown). Which later put was adopted is not
// known for sure, only which could be: one differing from spec in its
// quota alone, a quota the placement fits (planner.QuotaAdopts). One
// that differs in more (constraints, a manual pool, priority) may have
// placed otherwise and is not taken; one that cannot have been adopted,
// never taken (taken, a pending spec's replan would keep the placement
// on a spec it does not fit, and release the plan: review rev5). A put
// that could have been adopted but was stored while no planner ran is
// taken too: the planner then follows the spec a planner running
// through it would have.
//
// A removal after spec ends adoption: no put, before it or after, is
// taken. One after it was never adopted onto this placement (the
// removal released it, or was to: removedSince); one before it cannot
// be told from a removal not yet released, and spec is the safer.
func adoptedAs(spec *planner.Spec, placed *planner.Plan, later []jetstream.KeyValueEntry) (*planner.Spec, uint64) {
	for _, e := range later {
		if e.Operation() != jetstream.KeyValuePut {
			return spec, 0
		}
	}
	for i := len(later) - 1; i >= 0; i-- {
		e := later[i]
		next, err := planner.ParseSpec(e.Value())
		if err != nil {
			continue
		}
		if planner.QuotaAdopts(spec, next, placed) {
			return next, e.Revision()
		}
	}
	return spec, 0
}

// conflicted wraps a conflict for replan to re-read s's latest.
func conflicted(s *planState, err error) error {
	if errors.Is(err, store.ErrConflict) {
		return &conflict{state: s, err: err}
	}
	return err
}

// load reads the plan's latest revision, once, for a state made when its
// spec appeared.
func (p *loopState) load(ctx context.Context, s *planState) error {
	done := s.loaded
	if done {
		return nil
	}
	octx, end := p.op(ctx, "reading plan "+s.name+"'s latest revision", p.readTimeout(s))
	sp, err := p.plans.Latest(octx, s.name)
	end()
	if err != nil {
		return err
	}
	sp = p.aboveMark(s, sp)
	if s.latest == nil || sp != nil && sp.Plan.Revision > s.latest.Plan.Revision {
		s.latest = sp
	}
	if s.latest != nil {
		p.learnOwners(s.latest.Plan)
	}
	// Its nodes settle as after a restart (settling).
	if s.latest != nil && s.latest.Plan.Placed() && s.inherited == nil {
		s.inherited = s.latest.Plan
	}
	s.reconcile = s.latest != nil
	s.loaded = true
	latest, removing := s.latest, s.removing
	if !removing {
		// A plan whose spec is removed says so in its next revision.
		p.gauges(s, latest)
	}
	return nil
}

// publishRemoved publishes the last revision of a plan whose spec was
// removed (publishRemoval, on the spec it was planned on); the state is
// then dropped.
func (p *loopState) publishRemoved(ctx context.Context, s *planState) error {
	if err := p.publishRemoval(ctx, s, s.specOn()); err != nil {
		return err
	}
	p.drop(s)
	return nil
}

// publishRemoval publishes the revision that says s's spec was removed,
// unless its latest says so: no workers (every node's assignment
// emptied), removed, and the reason; on says the spec it was planned on.
func (p *loopState) publishRemoval(ctx context.Context, s *planState, on specOn) error {
	latest := s.latest
	if latest != nil && !latest.Plan.Removed() {
		doc := &planner.Plan{}
		doc.Header = latest.Plan.Header
		doc.Error, doc.Moved, doc.GPUsHeld, doc.PreemptedBy = "spec removed (planner spec rm): workers released", 0, 0, nil
		doc.Unplaced, doc.PendingSpec = nil, nil
		doc.Status = plan.Status{State: plan.StateInvalid, Reason: plan.ReasonRemoved}
		doc.Explanations, doc.Warnings = nil, nil
		doc.Placement = plan.Placement{ResourcePool: []plan.PoolExport{}, Pools: []plan.Pool{}, StorageToTrainWorkers: map[string][]int{}}
		return p.publishOn(ctx, s, on, planner.Outcome{Plan: doc, Change: &planner.Change{}, Err: errors.New(doc.Error)}, nil, "")
	}
	return nil
}

// specOn is the spec a revision is published on: its digest
// (client.SpecDigestHeader) and spec bucket revision
// (client.SpecRevisionHeader; 0: not known).
type specOn struct {
	digest string
	rev    uint64
}

// specOn is the spec s plans on.
func (s *planState) specOn() specOn { return specOn{digest: s.digest, rev: s.specRev} }

// drop forgets a removed plan's state and ends every series of the
// plan.
func (p *loopState) drop(s *planState) {
	s.spec, s.digest, s.specBytes, s.removing, s.age, s.specRev, s.removedAt = nil, "", nil, false, 0, 0, 0
	if p.states[s.name] == s {
		delete(p.states, s.name)
	}
	p.leader.ended(p.Service, s.name)
}

// publishNext publishes o, the plan's next placement, as the next
// revision if it differs from the latest.
func (p *loopState) publishNext(ctx context.Context, s *planState, o planner.Outcome, changes []string) error {
	return p.publish(ctx, s, o, changes, "")
}

// publishRelease publishes the plan's release step (planner.ReleaseStep): next
// restricted to what the plan holds (held), for the plans takers to
// take what it gives up before its new revision takes what they give
// up.
func (p *loopState) publishRelease(ctx context.Context, s *planState, next *planner.Plan, held, touched map[string]bool, takers []string, changes []string) error {
	latest := p.latestPlan(s)
	step := planner.ReleaseStep(latest, next, held, touched, takers)
	step.Moved = planner.CountMoved(latest, step)
	lead := fmt.Sprintf("release step: gives up the GPUs plan %s takes before this plan takes theirs; %d of %d workers wait for the next revision",
		strings.Join(takers, ", plan "), next.Workers.Len()-step.Workers.Len(), next.Workers.Len())
	return p.publish(ctx, s, planner.Outcome{Plan: step, Change: &planner.Change{}}, changes, lead)
}

// latestPlan is the plan's latest revision (nil: none).
func (p *Service) latestPlan(s *planState) *planner.Plan {
	return s.latestPlan()
}

// revisionOf is the plan's latest revision number (0: none).
func (p *Service) revisionOf(s *planState) int {
	return s.revision()
}

// publish is publishNext; lead, when not empty, begins the reason.
func (p *loopState) publish(ctx context.Context, s *planState, o planner.Outcome, changes []string, lead string) error {
	return p.publishOn(ctx, s, s.specOn(), o, changes, lead)
}

// publishOn is publish on spec on.
func (p *loopState) publishOn(ctx context.Context, s *planState, on specOn, o planner.Outcome, changes []string, lead string) error {
	// Comparing, diffing and encoding a large plan takes a while.
	defer p.allow("publishing plan "+s.name, p.storeTimeout(o.Plan.Workers.Len()/8))()
	latest, digest, note := s.latest, on.digest, s.note
	var prev *planner.Plan
	var expect uint64
	if latest != nil {
		prev, expect = latest.Plan, latest.Seq
	}
	specChanged := latest != nil && latest.SpecDigest != digest && !o.Plan.Removed()
	next, ch := o.Plan, o.Change
	// An unreadable latest is replaced even by the same placement.
	if prev != nil && !latest.Unreadable && !latest.Orphan && planner.SamePlacement(prev, next) && prev.Priority == next.Priority && planner.SameSpecFacts(prev, next) {
		p.adoptSpec(s, latest, next, specChanged, on)
		return nil
	}
	next.Name = s.name
	next.Revision = 1
	if prev != nil {
		next.Revision = prev.Revision + 1
	}
	next.CreatedAt = p.cfg.Now().UTC()
	// Its status says whether this placement was made afresh, and why.
	next.Status.Fresh = ""
	if ch != nil && ch.Fresh && next.Placed() {
		next.Status.Fresh = ch.FreshKind
	}
	next.Reason = join(lead, join(note, fullReason(prev, next, changes, specChanged, ch)))
	switch {
	case latest != nil && latest.Orphan && latest.Unreadable:
		// A stand-in for the high-water mark (aboveMark).
		next.Reason = join(fmt.Sprintf("%s: revision %d continues after it", latest.Plan.Error, next.Revision), next.Reason)
	case latest != nil && latest.Orphan:
		next.Reason = join(fmt.Sprintf("the plan history was lost (stream recreated): revision %d republished whole", next.Revision), next.Reason)
	}
	// With no latest no event carries a change, and the assignments read
	// next node by node: a first revision's change, every worker copied,
	// would be garbage the moment it was made.
	var change *plan.Change
	if latest != nil {
		change = planner.Diff(prev, next)
	}
	ev, stored, err := p.event(ctx, latest, next, change)
	if err != nil {
		return err
	}
	digests := store.Digests{Spec: digest, SpecRevision: on.rev}
	if next.PendingSpec != nil && latest != nil {
		// Kept on the spec the latest's placement followed.
		digests.PlacedFor = latest.SpecDigest
		if latest.Plan.PendingSpec != nil {
			digests.PlacedFor = latest.PlacedFor // "": not known
		}
	}
	seq, err := p.publishFenced(ctx, ev, digests, expect)
	if (errors.Is(err, store.ErrConflict) || errors.Is(err, bus.ErrLeaseLost)) && ev.Snapshot != "" {
		// Refused for sure, so no event names this snapshot. (After other
		// errors, a timeout, the event may have been stored.)
		dctx, done := p.op(context.WithoutCancel(ctx), "dropping a snapshot", p.cfg.StoreTimeout)
		p.plans.DropSnapshot(dctx, ev.Snapshot)
		done()
	}
	if err != nil {
		return err
	}
	stored.Seq, stored.SpecDigest, stored.PlacedFor, stored.SpecRevision = seq, digest, digests.PlacedFor, on.rev
	p.published(s, stored, note)
	p.cfg.Metrics.Published(next.Name, next.Revision, next.Valid(), next.Workers.Len(), s.heldShares(prev, next), next.Moved)
	p.cfg.Metrics.Shared(next.Name, next.Priority, len(next.PreemptedBy) > 0)
	elasticMetrics(p.cfg.Metrics, next, true)
	line := s.log.Info()
	if !next.Valid() && !next.Removed() {
		line = s.log.Warn().Str("error", next.Error)
	}
	line.Int("revision", next.Revision).Bool("valid", next.Valid()).Str("state", string(next.PlanState())).Int("unplaced", len(next.Unplaced)).
		Int("moved", next.Moved).Str("kind", ev.Kind()).Str("reason", next.Reason).Msg("plan published")
	if ev.Kind() == "snapshot" {
		defer p.storeSummary(ctx, s, next, seq)()
	}
	if err := p.publishAssignments(ctx, s, prev, next, change); err != nil {
		s.reconcile = true
		return err
	}
	if ev.Kind() != "change" {
		p.retain(ctx, s)
	}
	return nil
}

// publishFenced publishes ev checked against this planner's lease as
// it is now (no renewal in between), or, with none (a planner used
// without its loop), against the plan's last event. A planner with its
// loop publishes only on the lease the loop caught up on (Service.led):
// one taken since, the loop not caught up on it, is refused as lost.
func (p *Service) publishFenced(ctx context.Context, ev *plan.Event, digests store.Digests, expect uint64) (uint64, error) {
	// Every plan's publish is fenced by the one lease.
	p.fence.mu.Lock()
	defer p.fence.mu.Unlock()
	lease, epoch := p.fence.held()
	if p.fence.elected.Load() && (lease == 0 || epoch != p.led.Load()) {
		// Stood down since the replan began, or the lease changed: no
		// publish but on the lease the loop leads on.
		return 0, fmt.Errorf("publish %s revision %d: %w", ev.Name, ev.Revision, bus.ErrLeaseLost)
	}
	// Renewals wait while this holds fence.mu: bound it well inside the TTL.
	ctx, done := p.op(ctx, fmt.Sprintf("publishing plan %s revision %d", ev.Name, ev.Revision), p.cfg.LeaseTTL/2)
	defer done()
	return p.plans.PublishEventFor(ctx, ev, digests, expect, lease)
}

// adoptSpec takes a new spec that plans as the old one did (next, its
// run's plan, placed as latest is), so that the next inventory change
// replans from the plan's state again, and on the new spec: with the
// old one's run, a node lost next would say the new spec is pending,
// where a planner restarted on the document (whose demands are the new
// spec's) says it is in force.
func (p *Service) adoptSpec(s *planState, latest *store.StoredPlan, next *planner.Plan, specChanged bool, on specOn) {
	if !specChanged {
		return
	}
	if s.latest == latest {
		adopted := *latest
		adopted.SpecDigest, adopted.SpecRevision = on.digest, on.rev
		adopted.Plan = latest.Plan.WithRunOf(next)
		s.latest = &adopted
		// Planned on the spec in force, the spec watch live.
		s.removalChecked = s.latest
	}
}

// published makes sp the latest plan and starts a new change log; note,
// said in its reason, is said.
func (p *loopState) published(s *planState, sp *store.StoredPlan, note string) {
	p.mark(s, sp.Plan.Revision)
	p.keepPlacement(s, sp)
	// Published with the spec watch live: a removal since is the
	// watch's to deliver (planState.removedAt).
	s.removalChecked = sp
	if s.note == note {
		s.note = ""
	}
	// Gone nodes the plan no longer holds cannot be an outage's.
	if len(s.expired) > 0 {
		on := sp.Plan.NodeIndex()
		for id := range s.expired {
			if len(on(id)) == 0 {
				delete(s.expired, id)
			}
		}
	}
	if s.latest == nil || sp.Plan.Revision > s.latest.Plan.Revision {
		s.latest = sp
	}
	clear(s.basis)
	// Readers (a lookup of the latest) see it as soon as the stream has
	// it, not once the replan's other publishes are done.
	p.publishSnapshot(true)
}

// event is how next travels, and what it will be as the latest: whole
// when it is small (then the event reads as the plan document), else as
// the change from the latest while the chain of changes is short, weighs
// less than its base and the change fits a message, else stored whole as
// a snapshot object the event names. A snapshot event carries the change
// too when it fits, so that followers apply it without the object.
func (p *Service) event(ctx context.Context, latest *store.StoredPlan, next *planner.Plan, change *plan.Change) (*plan.Event, *store.StoredPlan, error) {
	stored := &store.StoredPlan{Plan: next, Meta: client.Meta{Base: next.Revision}}
	limit := min(maxChange, p.link.BodyLimit())
	if next.Workers.Len() <= p.cfg.InlineWorkers {
		ev := &plan.Event{Header: next.Header, Base: next.Revision, Placement: &next.Placement}
		if data, _, err := wire.Encode(ev); err == nil && len(data) <= limit {
			stored.BaseBytes = len(data)
			return ev, stored, nil
		}
	}
	// A change applies to the latest only when that could be read.
	ev := &plan.Event{Header: next.Header}
	var data []byte
	if latest != nil && !latest.Unreadable && !latest.Orphan {
		ev.Change = change
		var err error
		if data, _, err = wire.Encode(ev); err != nil || len(data) > limit {
			ev.Change = nil
		}
	}
	if ev.Change != nil && next.Revision-latest.Base < p.cfg.SnapshotEvery &&
		(latest.BaseBytes == 0 || latest.ChainBytes+len(data) <= latest.BaseBytes) {
		ev.Base = latest.Base
		stored.Base, stored.BaseBytes, stored.ChainBytes = latest.Base, latest.BaseBytes, latest.ChainBytes+len(data)
		return ev, stored, nil
	}
	sctx, done := p.op(ctx, fmt.Sprintf("storing plan %s revision %d's snapshot", next.Name, next.Revision), p.storeTimeout(next.Workers.Len()/8))
	name, size, err := p.plans.PutSnapshot(sctx, &next.Document)
	done()
	if err != nil {
		return nil, nil, err
	}
	ev.Base, ev.Snapshot, stored.BaseBytes = next.Revision, name, size
	return ev, stored, nil
}

// retain drops the oldest revisions past the history limits, from a whole
// document on, so every revision kept can be rebuilt.
func (p *loopState) retain(ctx context.Context, s *planState) {
	ctx, done := p.op(ctx, "trimming plan "+s.name+"'s history", p.readTimeout(s))
	defer done()
	if err := p.plans.Retain(ctx, s.name, p.cfg.HistoryAge, p.cfg.HistoryBytes, p.cfg.Now()); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Warn().Err(err).Msg("trimming the plan history failed; it will be tried again")
	}
}

// fullReason is reason and sharing together (sharing alone when reason
// would only say "inventory changed").
func fullReason(prev, next *planner.Plan, changes []string, specChanged bool, ch *planner.Change) string {
	why, shared := reason(prev, changes, specChanged, ch), sharing(prev, next)
	if shared != "" && why == nothingSaid {
		why = ""
	}
	return join(why, shared)
}

// sharing says what plans sharing the cluster did to this one: took its
// GPUs, or gave room back.
func sharing(prev, next *planner.Plan) string {
	switch {
	case next.Removed():
		return "spec removed: the plan's workers are released"
	case len(next.Status.Resized) > 0:
		return next.Status.ResizeWords(next.Name)
	case len(next.PreemptedBy) > 0:
		return "gave way to plan " + strings.Join(next.PreemptedBy, ", plan ") + " (higher priority)"
	case prev != nil && prev.PlanState() == plan.StateDegraded && next.Valid():
		return "back whole: the unplaced workers are placed again"
	case prev != nil && !prev.Valid() && next.Valid():
		return "placed: there is room again"
	}
	return ""
}

// nothingSaid is the reason of a revision when nothing more is known.
const nothingSaid = "inventory changed"

// reason says why a new revision exists: which nodes came or went, which
// GPUs turned unhealthy, a spec change, and what the planner did.
func reason(prev *planner.Plan, changes []string, specChanged bool, ch *planner.Change) string {
	var parts []string
	if prev == nil {
		parts = append(parts, "first plan")
	}
	if specChanged {
		parts = append(parts, "spec changed")
	}
	if prev != nil {
		parts = append(parts, changes...)
	}
	if s := ch.Summary(); s != "" && ch.FreshKind != plan.FreshFirst {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		parts = append(parts, nothingSaid)
	}
	return strings.Join(parts, "; ")
}

// join joins reason parts that are not empty.
func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
