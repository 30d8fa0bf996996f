package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// guardEvery is how often the planner checks that its connection did not
// come back from a reconnect unnoticed and that NATS still keeps its
// streams and buckets.
const guardEvery = 2 * time.Second

// guard rides out NATS trouble: after a reconnect it re-reads the whole
// inventory (a key may have expired while it could not hear), and a
// stream or bucket that is gone (a server restarted with its store
// wiped, a deletion by hand) is made again, logged as the error it is,
// and refilled from what this planner holds: the spec, the latest plan
// (as the next revision, whole), the assignments.
func (l *loop) guard(ctx context.Context) {
	l.p.cfg.Metrics.Inventory(l.p.inventorySize())
	if !l.p.cfg.NC.IsConnected() {
		return
	}
	reconnected := false
	if n := l.p.cfg.NC.Stats().Reconnects; n != l.reconnects {
		l.reconnects, reconnected = n, true
		l.noteReconnect()
	}
	missing, invLast, err := l.p.missing(ctx, &l.plansCreated)
	if err != nil {
		l.log.Debug().Err(err).Msg("cannot check the streams")
		return
	}
	if len(missing) > 0 {
		l.log.Error().Strs("missing", missing).Msg("NATS lost the planner's state (a server restarted with its store wiped, or someone deleted it); recreating it and refilling it from this planner's memory")
		if err := l.recreate(ctx, missing); err != nil {
			l.log.Error().Err(err).Msg("recreating the planner's state failed; retrying")
			return
		}
	}
	stalled := l.stalled(invLast)
	if stalled {
		l.log.Warn().Uint64("stream", invLast).Uint64("watch", l.seen).Msg("the inventory watch is stuck behind the stream (its consumer went with a server?)")
	}
	l.specsStuck(ctx)
	if reconnected || stalled || len(missing) > 0 {
		l.log.Info().Bool("reconnected", reconnected).Msg("re-reading the whole inventory and the spec")
		l.restartWatches(ctx)
		return
	}
	l.rewatch(ctx)
}

// rewatch follows the plan and watches the spec again where either
// ended (its stream went away under it, and came back).
func (l *loop) rewatch(ctx context.Context) {
	for _, s := range l.p.everyState() {
		_ = l.follow(ctx, s) // a failure is tried again at the next guard
	}
	if _, stopped := l.specW.(stoppedWatch); stopped {
		_ = l.watchSpecs(ctx) // a failure is tried again at the next guard
	}
}

// specsStuck notices a spec watch that has not delivered the bucket's
// contents within the store's deadline (a damaged bucket): no plan is
// made until it has, so it is an error, logged once and in Health, and
// the watch is made again.
func (l *loop) specsStuck(ctx context.Context) {
	if l.specsIn || l.specWatched.IsZero() || time.Since(l.specWatched) < l.p.cfg.StoreTimeout {
		return
	}
	why := fmt.Sprintf("the spec bucket has not delivered its contents in %s (a damaged bucket?): no plan is made until it does", time.Since(l.specWatched).Round(time.Second))
	if !l.specsSaid {
		l.log.Error().Msg(why + "; watching it again")
	}
	l.p.problem("specs", why)
	_ = l.specW.Stop()
	l.specW = stoppedWatch{}
	if l.watchSpecs(ctx) == nil {
		l.specsSaid = true // watchSpecs cleared it: say it once
	}
}

// prune stops following the plans whose states were dropped.
func (l *loop) prune() {
	live := map[*Planner]bool{}
	for _, s := range l.p.everyState() {
		live[s] = true
	}
	for s := range l.following {
		if !live[s] {
			l.unfollow(s)
		}
	}
}

// noteReconnect notes when this planner's connection came back, for
// outage.
func (l *loop) noteReconnect() {
	if n := l.p.cfg.NC.Stats().Reconnects; n != l.outageReconnects {
		l.outageReconnects, l.reconnectedAt = n, time.Now()
	}
}

// stalled says whether the inventory watch delivered nothing for a whole
// guard period while the stream moved past it: reporters heartbeat all
// the time, so a watch that works never stands still behind it.
func (l *loop) stalled(streamLast uint64) bool {
	// The stream must have moved since the last look: its newest
	// messages may have expired, which no watch delivers.
	moved := streamLast > l.streamAtGuard
	l.streamAtGuard = streamLast
	behind := l.events != nil && moved && streamLast > l.seen && l.seen == l.seenAtGuard
	l.seenAtGuard = l.seen
	if !behind {
		l.behind = 0
		return false
	}
	l.behind++
	return l.behind >= 2
}

// missing lists the streams of the planner's state that NATS no longer
// has.
// It also returns the inventory stream's last sequence. A plan stream
// made anew since the last look (*plansCreated; another planner
// recreated it before this one noticed it gone) counts as missing: its
// sequences, the lease's among them, began again.
func (p *Planner) missing(ctx context.Context, plansCreated *time.Time) ([]string, uint64, error) {
	ctx, done := p.op(ctx, "checking the streams", guardEvery)
	defer done()
	var out []string
	var invLast uint64
	for _, name := range bus.StateStreams() {
		st, err := p.cfg.JS.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			out = append(out, name)
		case err != nil:
			return nil, 0, err
		case name == bus.InventoryStream:
			invLast = st.CachedInfo().State.LastSeq
		case name == client.PlansStream:
			created := st.CachedInfo().Created
			if !plansCreated.IsZero() && !created.Equal(*plansCreated) {
				out = append(out, name)
			}
			*plansCreated = created
		}
	}
	return out, invLast, nil
}

// recreate makes the missing streams again and puts back what this
// planner knows: the specs it plans on; for a lost plan stream, each
// plan's latest becomes its next revision, published whole, and the
// lease is taken again; for lost assignments, every node's.
func (l *loop) recreate(ctx context.Context, missing []string) error {
	p := l.p
	ctx, done := p.op(ctx, "recreating the streams", 6*p.cfg.StoreTimeout)
	defer done()
	if err := p.plans.Ensure(ctx); err != nil {
		return err
	}
	if _, err := p.specs.Ensure(ctx); err != nil {
		return err
	}
	if _, err := p.inv.Ensure(ctx); err != nil {
		return err
	}
	for _, name := range missing {
		switch name {
		case "KV_" + client.SpecBucket:
			for _, s := range p.states() {
				if err := s.restoreSpec(ctx); err != nil {
					return err
				}
			}
		case client.PlansStream:
			for _, s := range p.everyState() {
				s.orphaned()
			}
			// The leader knows the newest revision; a standby may lag
			// it. The leader takes the lease again at once, a standby
			// only if the leader has not within a TTL, so the sequence
			// goes on from the newest revision there was.
			wait := p.cfg.LeaseTTL
			if p.leading() != 0 {
				wait = 0
			}
			l.lease.stepDown("the plan stream, and the lease with it, was lost")
			l.lease.delay(wait)
			l.kick()
		case client.AssignmentsStream, "OBJ_" + client.PlansBucket:
			for _, s := range p.everyState() {
				s.mu.Lock()
				s.reconcile = s.latest != nil
				s.mu.Unlock()
			}
			l.armCheck(0)
		}
	}
	return nil
}

// restoreSpec puts back the spec the plan is planned on, into a spec
// bucket that was lost.
func (p *Planner) restoreSpec(ctx context.Context) error {
	p.mu.Lock()
	spec := p.specBytes
	p.mu.Unlock()
	if spec == nil {
		return nil
	}
	// Create, not put: a spec stored since (another planner restored
	// it, someone set a new one) stays.
	kv, err := p.specs.KV(ctx)
	if err == nil {
		_, err = kv.Create(ctx, p.cfg.Plan, spec)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("restore the spec of %s: %w", p.cfg.Plan, err)
	}
	return nil
}

// orphaned notes that the plan stream was lost: the latest revision
// is republished whole as the next, and every assignment reconciled.
func (p *Planner) orphaned() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest != nil {
		orphan := *p.latest
		orphan.Orphan = true
		p.latest = &orphan
	}
	p.reconcile = p.latest != nil
	p.assignSeq = map[string]uint64{}
}

// restartWatches re-reads the inventory (a full resync, reconciled
// against what the planner held) and the spec.
func (l *loop) restartWatches(ctx context.Context) {
	if l.stopWatch != nil {
		l.stopWatch()
	}
	// specsIn stays: every plan's state is known; a spec stored or
	// removed meanwhile comes with the new watch, and planning the others
	// until then gives nobody's GPUs away (a new plan holds none yet, a
	// removed one still holds its own).
	l.events, l.synced, l.seen, l.seenAtGuard, l.behind = nil, false, 0, 0, 0
	l.watch(ctx)
	_ = l.specW.Stop()
	l.specW = stoppedWatch{} // watched again at once (or at the next guard)
	l.rewatch(ctx)
}

// outage notices nodes of the latest plan gone in an inventory outage,
// not leaving: their keys ran out (a reporter that deletes its key is
// leaving), most of them at once, or any shortly after this planner's
// connection came back (NATS away for longer than the keys' TTL, the
// inventory bucket lost; the reporters then put their keys again). The
// planner then settles as after a restart: it waits for those nodes to
// report, up to Settle, and the revision says so. It returns whether it
// started settling.
func (l *loop) outage() bool {
	l.noteReconnect()
	for _, s := range l.p.states() {
		if l.outageOf(s) {
			return true
		}
	}
	return false
}

// outageOf is outage for one plan's state.
func (l *loop) outageOf(p *Planner) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.settlingOutage || p.latest == nil || !p.latest.Plan.Placed() || p.cfg.Settle < 0 {
		return false
	}
	nodes := map[string]bool{}
	for _, pl := range p.latest.Plan.Pools {
		for _, n := range pl.Nodes {
			nodes[n.NodeID] = true
		}
	}
	lost := 0
	for id := range nodes {
		if _, ok := p.live.doc(id); !ok && p.expired[id] {
			lost++
		}
	}
	reconnected := !l.reconnectedAt.IsZero() && time.Since(l.reconnectedAt) < p.cfg.Settle
	most := len(nodes) >= 2 && lost*2 > len(nodes)
	if lost == 0 || !most && !reconnected {
		return false
	}
	l.settlingOutage, l.started = true, time.Now()
	p.inherited, p.reported = p.latest.Plan, map[string]bool{}
	for _, id := range p.live.present() {
		p.reported[id] = true
	}
	why := "vanished at once (an inventory outage, not nodes leaving)"
	if reconnected {
		why = "vanished while NATS was away (their keys expired, not the nodes)"
	}
	p.note = fmt.Sprintf("%d of %d nodes %s: waited up to %s for them to report again", lost, len(nodes), why, p.cfg.Settle)
	p.log.Warn().Int("lost", lost).Int("nodes", len(nodes)).Bool("reconnected", reconnected).Str("settle", dur(p.cfg.Settle)).
		Msg("nodes of the plan vanished in an inventory outage: waiting for them to report again")
	return true
}
