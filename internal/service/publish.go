package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
func (p *Planner) afterFirstSync() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live.settled()
	if p.latest == nil {
		return
	}
	for _, pl := range p.latest.Plan.Pools {
		for _, n := range pl.Nodes {
			if _, ok := p.live.doc(n.NodeID); !ok {
				p.live.basis[n.NodeID] = &inventory.NodeInventory{NodeID: n.NodeID}
			}
		}
	}
}

// replan plans every plan of the loop together (planner.PlanAll: no
// GPU to two plans, lower priorities giving way) and publishes each that
// changed: its event, then the assignments of the nodes whose workers
// changed; a removed plan's last revision releases its workers. The
// publishes follow publishOrder: a GPU is published as taken only after
// the revision that gives it up, and a cycle of plans taking from each
// other is broken by a release step (order.go). On a conflict (another
// planner published first) it re-reads that plan's latest and plans
// again.
func (p *Planner) replan(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := p.replanOnce(ctx)
		var c *conflict
		if !errors.As(err, &c) {
			return err
		}
		if attempt >= maxConflicts {
			return c.err
		}
		octx, done := p.op(ctx, "reading plan "+c.state.cfg.Plan+"'s latest revision", p.storeTimeout(p.nodes()))
		sp, err := p.plans.Latest(octx, c.state.cfg.Plan)
		done()
		if err != nil {
			return err
		}
		c.state.adopted(sp)
	}
}

// conflict is a publish of state's plan refused because another planner
// published first.
type conflict struct {
	state *Planner
	err   error
}

func (c *conflict) Error() string { return c.err.Error() }
func (c *conflict) Unwrap() error { return c.err }

// replanOnce is one try of replan.
func (p *Planner) replanOnce(ctx context.Context) error {
	states := p.states()
	for _, s := range states {
		if err := s.load(ctx); err != nil {
			return err
		}
		if err := s.reconcileAssignments(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	nodes := p.live.planNodes()
	p.mu.Unlock()
	jobs, planned, err := releaseRemoved(ctx, states)
	if err != nil {
		return err
	}
	done := p.allow("planning", p.storeTimeout(len(nodes)))
	outs := planner.PlanAll(jobs, nodes)
	done()
	held, next, touched := holdings(jobs, outs, planned)
	changes := make([][]string, len(jobs))
	for i, s := range planned {
		if s != nil {
			s.mu.Lock()
			changes[i] = s.live.changes()
			s.mu.Unlock()
		}
	}
	released := make([]bool, len(jobs))
	for _, st := range publishOrder(held, next) {
		i := st.plan
		s := planned[i]
		if s == nil {
			continue // held as it was
		}
		var err error
		switch {
		case st.release:
			err = s.publishRelease(ctx, outs[i].Plan, held[i], touched, takersOf(jobs, held, next, i), changes[i])
			released[i] = err == nil
		case released[i]:
			// Moves counted from the release step, which placed some.
			if latest := s.latestPlan(); latest != nil {
				outs[i].Plan.Moved = planner.CountMoved(latest, outs[i].Plan)
			}
			fallthrough
		default:
			err = s.publishNext(ctx, outs[i], changes[i])
		}
		p.beat()
		if err != nil {
			return conflicted(s, err)
		}
	}
	// Still to do when the latest was unreadable before.
	for _, s := range states {
		if err := s.reconcileAssignments(ctx); err != nil {
			return err
		}
	}
	return nil
}

// releaseRemoved publishes the last revision of each removed plan, and
// returns the others as PlanAll's jobs, each with its state (nil for a
// plan held as it is).
func releaseRemoved(ctx context.Context, states []*Planner) ([]planner.Job, []*Planner, error) {
	var jobs []planner.Job
	var planned []*Planner
	for _, s := range states {
		s.mu.Lock()
		spec, latest, removing, age := s.spec, s.latest, s.removing, s.age
		s.mu.Unlock()
		if removing {
			if err := s.publishRemoved(ctx); err != nil {
				return nil, nil, conflicted(s, err)
			}
			continue
		}
		var prev *planner.Plan
		if latest != nil {
			prev = latest.Plan
		}
		if spec == nil {
			// None that parses: its last valid revision stays as it is,
			// and no other plan takes its GPUs.
			if prev != nil && prev.Placed() {
				jobs = append(jobs, planner.Job{Name: s.cfg.Plan, Prev: prev, Age: age})
				planned = append(planned, nil)
			}
			continue
		}
		jobs = append(jobs, planner.Job{Name: s.cfg.Plan, Spec: spec, Prev: prev, Age: age})
		planned = append(planned, s)
	}
	return jobs, planned, nil
}

// conflicted wraps a conflict for replan to re-read s's latest.
func conflicted(s *Planner, err error) error {
	if errors.Is(err, store.ErrConflict) {
		return &conflict{state: s, err: err}
	}
	return err
}

func subset(a, b map[string]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// load reads the plan's latest revision, once, for a state made when its
// spec appeared.
func (p *Planner) load(ctx context.Context) error {
	p.mu.Lock()
	done := p.loaded
	p.mu.Unlock()
	if done {
		return nil
	}
	octx, end := p.op(ctx, "reading plan "+p.cfg.Plan+"'s latest revision", p.storeTimeout(p.nodes()))
	sp, err := p.plans.Latest(octx, p.cfg.Plan)
	end()
	if err != nil {
		return err
	}
	sp = p.aboveMark(sp)
	p.mu.Lock()
	if p.latest == nil || sp != nil && sp.Plan.Revision > p.latest.Plan.Revision {
		p.latest = sp
	}
	// Its nodes settle as the lead's do after a restart (settling).
	if p.latest != nil && p.latest.Plan.Placed() && p.inherited == nil {
		p.inherited = p.latest.Plan
	}
	p.reconcile = p.latest != nil
	p.loaded = true
	latest, removing := p.latest, p.removing
	p.mu.Unlock()
	if !removing {
		// A plan whose spec is removed says so in its next revision.
		p.gauges(latest)
	}
	return nil
}

// publishRemoved publishes the last revision of a plan whose spec was
// removed: no workers (every node's assignment emptied), removed, and
// the reason; the state is then dropped.
func (p *Planner) publishRemoved(ctx context.Context) error {
	p.mu.Lock()
	latest := p.latest
	p.mu.Unlock()
	if latest != nil && !latest.Plan.Removed {
		doc := &planner.Plan{}
		doc.Header = latest.Plan.Header
		doc.Valid, doc.Error, doc.Removed, doc.Moved, doc.GPUsHeld, doc.PreemptedBy = false, "spec removed (planner spec rm): workers released", true, 0, 0, nil
		doc.State, doc.Unplaced, doc.PendingSpec = plan.StateInvalid, nil, nil
		doc.Explanations, doc.Warnings = nil, nil
		doc.Placement = plan.Placement{ResourcePool: []plan.PoolExport{}, Pools: []plan.Pool{}, StorageToTrainWorkers: map[string][]int{}}
		if err := p.publishNext(ctx, planner.Outcome{Plan: doc, Change: &planner.Change{}, Err: errors.New(doc.Error)}, nil); err != nil {
			return err
		}
	}
	p.top().drop(p)
	return nil
}

// drop forgets a removed plan's state (the lead's own stays, spec-less)
// and ends every series of the plan.
func (p *Planner) drop(s *Planner) {
	s.mu.Lock()
	s.spec, s.digest, s.specBytes, s.removing, s.age = nil, "", nil, false, 0
	s.mu.Unlock()
	p.gaugeMu.Lock()
	defer p.gaugeMu.Unlock()
	if s != p {
		p.sibMu.Lock()
		delete(p.sibs, s.cfg.Plan)
		p.sibMu.Unlock()
	}
	p.cfg.Metrics.Removed(s.cfg.Plan)
}

// publishNext publishes o, the plan's next placement, as the next
// revision if it differs from the latest.
func (p *Planner) publishNext(ctx context.Context, o planner.Outcome, changes []string) error {
	return p.publish(ctx, o, changes, "")
}

// publishRelease publishes the plan's release step (releaseStep): next
// restricted to what the plan holds (held), for the plans takers to
// take what it gives up before its new revision takes what they give
// up.
func (p *Planner) publishRelease(ctx context.Context, next *planner.Plan, held, touched map[string]bool, takers []string, changes []string) error {
	latest := p.latestPlan()
	step := releaseStep(latest, next, held, touched, takers)
	step.Moved = planner.CountMoved(latest, step)
	lead := fmt.Sprintf("release step: gives up the GPUs plan %s takes before this plan takes theirs; %d of %d workers wait for the next revision",
		strings.Join(takers, ", plan "), next.Workers.Len()-step.Workers.Len(), next.Workers.Len())
	return p.publish(ctx, planner.Outcome{Plan: step, Change: &planner.Change{}}, changes, lead)
}

// takersOf names the plans that take a GPU plan i gives up.
func takersOf(jobs []planner.Job, held, next []map[string]bool, i int) []string {
	var out []string
	for j := range jobs {
		if j == i {
			continue
		}
		for k := range next[j] {
			if held[i][k] && !next[i][k] && !held[j][k] {
				out = append(out, jobs[j].Name)
				break
			}
		}
	}
	return out
}

// latestPlan is the plan's latest revision (nil: none).
func (p *Planner) latestPlan() *planner.Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest == nil {
		return nil
	}
	return p.latest.Plan
}

// publish is publishNext; lead, when not empty, begins the reason.
func (p *Planner) publish(ctx context.Context, o planner.Outcome, changes []string, lead string) error {
	// Comparing, diffing and encoding a large plan takes a while.
	defer p.allow("publishing plan "+p.cfg.Plan, p.storeTimeout(o.Plan.Workers.Len()/8))()
	p.mu.Lock()
	latest, digest, note := p.latest, p.digest, p.note
	p.mu.Unlock()
	var prev *planner.Plan
	var expect uint64
	if latest != nil {
		prev, expect = latest.Plan, latest.Seq
	}
	specChanged := latest != nil && latest.SpecDigest != digest && !o.Plan.Removed
	next, ch := o.Plan, o.Change
	// An unreadable latest is replaced even by the same placement.
	if prev != nil && !latest.Unreadable && !latest.Orphan && planner.SamePlacement(prev, next) && prev.Priority == next.Priority {
		p.adoptSpec(latest, specChanged, digest)
		return nil
	}
	next.Name = p.cfg.Plan
	next.Revision = 1
	if prev != nil {
		next.Revision = prev.Revision + 1
	}
	next.CreatedAt = p.cfg.Now().UTC()
	next.Reason = join(lead, join(note, fullReason(prev, next, changes, specChanged, ch)))
	switch {
	case latest != nil && latest.Orphan && latest.Unreadable:
		// A stand-in for the high-water mark (aboveMark).
		next.Reason = join(fmt.Sprintf("%s: revision %d continues after it", latest.Plan.Error, next.Revision), next.Reason)
	case latest != nil && latest.Orphan:
		next.Reason = join(fmt.Sprintf("the plan history was lost (stream recreated): revision %d republished whole", next.Revision), next.Reason)
	}
	change := planner.Diff(prev, next)
	ev, stored, err := p.event(ctx, latest, next, change)
	if err != nil {
		return err
	}
	seq, err := p.publishFenced(ctx, ev, digest, expect)
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
	stored.Seq, stored.SpecDigest = seq, digest
	p.published(stored, note)
	p.cfg.Metrics.Published(next.Name, next.Revision, next.Valid, next.Workers.Len(), gpusHeld(next), next.Moved)
	p.cfg.Metrics.Shared(next.Name, next.Priority, len(next.PreemptedBy) > 0)
	line := p.log.Info()
	if !next.Valid && !next.Removed {
		line = p.log.Warn().Str("error", next.Error)
	}
	line.Int("revision", next.Revision).Bool("valid", next.Valid).Str("state", next.PlanState()).Int("unplaced", len(next.Unplaced)).
		Int("moved", next.Moved).Str("kind", ev.Kind()).Str("reason", next.Reason).Msg("plan published")
	if err := p.publishAssignments(ctx, prev, next, change); err != nil {
		p.mu.Lock()
		p.reconcile = true
		p.mu.Unlock()
		return err
	}
	if ev.Kind() != "change" {
		p.retain(ctx)
	}
	return nil
}

// publishFenced publishes ev checked against this planner's lease as
// it is now (no renewal in between), or, with none (a planner used
// without its loop), against the plan's last event.
func (p *Planner) publishFenced(ctx context.Context, ev *plan.Event, digest string, expect uint64) (uint64, error) {
	// Every plan's publish is fenced by the lead's one lease.
	t := p.top()
	t.pubMu.Lock()
	defer t.pubMu.Unlock()
	lease := t.leading()
	if lease == 0 && t.elected {
		// Stood down since the replan began: no unfenced publish.
		return 0, fmt.Errorf("publish %s revision %d: %w", ev.Name, ev.Revision, bus.ErrLeaseLost)
	}
	// Renewals wait while this holds pubMu: bound it well inside the TTL.
	ctx, done := p.op(ctx, fmt.Sprintf("publishing plan %s revision %d", ev.Name, ev.Revision), p.cfg.LeaseTTL/2)
	defer done()
	return p.plans.PublishEvent(ctx, ev, digest, expect, lease)
}

// adoptSpec takes a new spec that plans as the old one did, so that the
// next inventory change replans from the plan's state again.
func (p *Planner) adoptSpec(latest *store.StoredPlan, specChanged bool, digest string) {
	if !specChanged {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest == latest {
		adopted := *latest
		adopted.SpecDigest = digest
		p.latest = &adopted
	}
}

// published makes sp the latest plan and starts a new change log; note,
// said in its reason, is said.
func (p *Planner) published(sp *store.StoredPlan, note string) {
	p.mark(sp.Plan.Revision)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.note == note {
		p.note = ""
	}
	// Gone nodes the plan no longer holds cannot be an outage's.
	if len(p.expired) > 0 {
		on := sp.Plan.NodeIndex()
		for id := range p.expired {
			if len(on(id)) == 0 {
				delete(p.expired, id)
			}
		}
	}
	if p.latest == nil || sp.Plan.Revision > p.latest.Plan.Revision {
		p.latest = sp
	}
	p.live.settled()
}

// event is how next travels, and what it will be as the latest: whole
// when it is small (then the event reads as the plan document), else as
// the change from the latest while the chain of changes is short, weighs
// less than its base and the change fits a message, else stored whole as
// a snapshot object the event names. A snapshot event carries the change
// too when it fits, so that followers apply it without the object.
func (p *Planner) event(ctx context.Context, latest *store.StoredPlan, next *planner.Plan, change *plan.Change) (*plan.Event, *store.StoredPlan, error) {
	stored := &store.StoredPlan{Plan: next, Base: next.Revision}
	limit := min(maxChange, bus.BodyLimit(p.cfg.NC))
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
func (p *Planner) retain(ctx context.Context) {
	ctx, done := p.op(ctx, "trimming plan "+p.cfg.Plan+"'s history", p.storeTimeout(p.nodes()))
	defer done()
	if err := p.plans.Retain(ctx, p.cfg.Plan, p.cfg.HistoryAge, p.cfg.HistoryBytes, p.cfg.Now()); err != nil && !errors.Is(err, context.Canceled) {
		p.log.Warn().Err(err).Msg("trimming the plan history failed; it will be tried again")
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
	case next.Removed:
		return "spec removed: the plan's workers are released"
	case len(next.PreemptedBy) > 0:
		return "gave way to plan " + strings.Join(next.PreemptedBy, ", plan ") + " (higher priority)"
	case prev != nil && prev.PlanState() == plan.StateDegraded && next.Valid:
		return "back whole: the unplaced workers are placed again"
	case prev != nil && !prev.Valid && next.Valid:
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
	if s := ch.Summary(); s != "" && !(ch.Fresh && ch.FreshWhy == "first plan") {
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

// gpusHeld is the GPUs a plan's workers hold, fractional shares summed.
func gpusHeld(p *planner.Plan) float64 {
	held := 0.0
	for _, w := range p.Workers.All() {
		held += w.GPUShare * float64(len(w.GPUs))
	}
	return held
}
