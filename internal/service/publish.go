package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
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
	clear(p.live.basis)
	if p.latest == nil {
		return
	}
	for _, pl := range p.latest.Plan.Pools {
		for _, n := range pl.Nodes {
			if _, ok := p.live.docs[n.NodeID]; !ok {
				p.live.basis[n.NodeID] = &inventory.NodeInventory{NodeID: n.NodeID}
			}
		}
	}
}

// replan computes the next plan and publishes it if it changed: its
// event, then the assignments of the nodes whose workers changed. On a
// conflict (another planner published first) it re-reads the latest and
// recomputes.
func (p *Planner) replan(ctx context.Context) error {
	if err := p.reconcileAssignments(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	nodes := p.live.planNodes()
	changes := p.live.changes()
	p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := p.publishNext(ctx, nodes, changes)
		if err == nil {
			// Still to do when the latest was unreadable before.
			return p.reconcileAssignments(ctx)
		}
		if !errors.Is(err, bus.ErrConflict) || attempt >= maxConflicts {
			return err
		}
		sp, err := p.plans.Latest(ctx, p.cfg.Plan)
		if err != nil {
			return err
		}
		p.adopted(sp)
	}
}

// publishNext plans nodes from the latest revision and publishes the
// plan as the next one if it differs.
func (p *Planner) publishNext(ctx context.Context, nodes []planner.Node, changes []string) error {
	p.mu.Lock()
	latest, spec, digest, note := p.latest, p.spec, p.digest, p.note
	p.mu.Unlock()
	var prev *planner.Plan
	var expect uint64
	if latest != nil {
		prev, expect = latest.Plan, latest.Seq
	}
	specChanged := latest != nil && latest.SpecDigest != digest
	next, ch, _ := planner.Replan(prev, spec, nodes)
	// An unreadable latest is replaced even by the same placement.
	if prev != nil && !latest.Unreadable && !latest.Orphan && planner.SamePlacement(prev, next) {
		p.adoptSpec(latest, specChanged, digest)
		return nil
	}
	next.Name = p.cfg.Plan
	next.Revision = 1
	if prev != nil {
		next.Revision = prev.Revision + 1
	}
	next.CreatedAt = p.cfg.Now().UTC()
	next.Reason = join(note, reason(prev, changes, specChanged, ch))
	if latest != nil && latest.Orphan {
		next.Reason = join(fmt.Sprintf("the plan history was lost (stream recreated): revision %d republished whole", next.Revision), next.Reason)
	}
	change := planner.Diff(prev, next)
	ev, stored, err := p.event(ctx, latest, next, change)
	if err != nil {
		return err
	}
	seq, err := p.publishFenced(ctx, ev, digest, expect)
	if (errors.Is(err, bus.ErrConflict) || errors.Is(err, bus.ErrLeaseLost)) && ev.Snapshot != "" {
		// Refused for sure, so no event names this snapshot. (After other
		// errors, a timeout, the event may have been stored.)
		p.plans.DropSnapshot(context.WithoutCancel(ctx), ev.Snapshot)
	}
	if err != nil {
		return err
	}
	stored.Seq, stored.SpecDigest = seq, digest
	p.published(stored, note)
	p.cfg.Metrics.Published(next.Name, next.Revision, next.Valid, next.Workers.Len(), gpusHeld(next), next.Moved)
	line := p.cfg.Log.Info()
	if !next.Valid {
		line = p.cfg.Log.Warn().Str("error", next.Error)
	}
	line.Str("plan", next.Name).Int("revision", next.Revision).Bool("valid", next.Valid).
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
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	lease := p.leading()
	if lease == 0 && p.elected {
		// Stood down since the replan began: no unfenced publish.
		return 0, fmt.Errorf("publish %s revision %d: %w", ev.Name, ev.Revision, bus.ErrLeaseLost)
	}
	// Renewals wait while this holds pubMu: bound it well inside the TTL.
	ctx, cancel := context.WithTimeout(ctx, p.cfg.LeaseTTL/2)
	defer cancel()
	return p.plans.PublishEvent(ctx, ev, digest, expect, lease)
}

// adoptSpec takes a new spec that plans as the old one did, so that the
// next inventory change replans from the plan's state again.
func (p *Planner) adoptSpec(latest *bus.StoredPlan, specChanged bool, digest string) {
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
func (p *Planner) published(sp *bus.StoredPlan, note string) {
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
	clear(p.live.basis)
}

// event is how next travels, and what it will be as the latest: whole
// when it is small (then the event reads as the plan document), else as
// the change from the latest while the chain of changes is short, weighs
// less than its base and the change fits a message, else stored whole as
// a snapshot object the event names. A snapshot event carries the change
// too when it fits, so that followers apply it without the object.
func (p *Planner) event(ctx context.Context, latest *bus.StoredPlan, next *planner.Plan, change *plan.Change) (*plan.Event, *bus.StoredPlan, error) {
	stored := &bus.StoredPlan{Plan: next, Base: next.Revision}
	limit := min(maxChange, bus.BodyLimit(p.cfg.NC))
	if next.Workers.Len() <= p.cfg.InlineWorkers {
		ev := &plan.Event{Header: next.Header, Base: next.Revision, Placement: &next.Placement}
		if data, _, err := client.Encode(ev); err == nil && len(data) <= limit {
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
		if data, _, err = client.Encode(ev); err != nil || len(data) > limit {
			ev.Change = nil
		}
	}
	if ev.Change != nil && next.Revision-latest.Base < p.cfg.SnapshotEvery &&
		(latest.BaseBytes == 0 || latest.ChainBytes+len(data) <= latest.BaseBytes) {
		ev.Base = latest.Base
		stored.Base, stored.BaseBytes, stored.ChainBytes = latest.Base, latest.BaseBytes, latest.ChainBytes+len(data)
		return ev, stored, nil
	}
	name, size, err := p.plans.PutSnapshot(ctx, &next.Document)
	if err != nil {
		return nil, nil, err
	}
	ev.Base, ev.Snapshot, stored.BaseBytes = next.Revision, name, size
	return ev, stored, nil
}

// retain drops the oldest revisions past the history limits, from a whole
// document on, so every revision kept can be rebuilt.
func (p *Planner) retain(ctx context.Context) {
	if err := p.plans.Retain(ctx, p.cfg.Plan, p.cfg.HistoryAge, p.cfg.HistoryBytes, p.cfg.Now()); err != nil {
		p.cfg.Log.Warn().Err(err).Msg("trimming the plan history failed; it will be tried again")
	}
}

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
		parts = append(parts, "inventory changed")
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
