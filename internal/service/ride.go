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

// rideGuard is what the loop keeps to ride out NATS trouble (guard,
// outage): what it last saw of the connection and the streams, and
// whether it waits for nodes that vanished in an outage. The loop's
// goroutine alone uses it.
type rideGuard struct {
	// reconnects is the connection's count the inventory was last
	// re-read for.
	reconnects uint64
	// seen is the newest stream sequence the inventory watch delivered;
	// seenAtGuard, what it was at the last guard; behind, how many guards
	// in a row found the watch standing still behind the stream.
	seen, seenAtGuard uint64
	behind            int
	// streamAtGuard is the inventory stream's last sequence at the last
	// guard; plansCreated, when the plan stream was made, to notice it
	// made anew.
	streamAtGuard uint64
	plansCreated  time.Time
	// settlingOutage: nodes vanished in an outage, and the planner waits
	// for them to report again; settleWaiting: replan waits for the nodes
	// of a plan found at start or lost in an outage (and said so);
	// outageReconnects and reconnectedAt, the reconnects outage last saw
	// and when it saw the count change.
	settlingOutage   bool
	settleWaiting    bool
	outageReconnects uint64
	reconnectedAt    time.Time
}

// noteReconnect notes when the connection came back (its reconnects
// now n), for outage.
func (r *rideGuard) noteReconnect(n uint64, now time.Time) {
	if n != r.outageReconnects {
		r.outageReconnects, r.reconnectedAt = n, now
	}
}

// stalled says whether the inventory watch (watching: one is open)
// delivered nothing for a whole guard period while the stream moved
// past it (its last sequence now streamLast): reporters heartbeat all
// the time, so a watch that works never stands still behind it.
func (r *rideGuard) stalled(streamLast uint64, watching bool) bool {
	// The stream must have moved since the last look: its newest
	// messages may have expired, which no watch delivers.
	moved := streamLast > r.streamAtGuard
	r.streamAtGuard = streamLast
	behind := watching && moved && streamLast > r.seen && r.seen == r.seenAtGuard
	r.seenAtGuard = r.seen
	if !behind {
		r.behind = 0
		return false
	}
	r.behind++
	return r.behind >= 2
}

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
	l.conflictKeys = l.p.sayConflicts(l.conflictKeys)
	l.p.retryOwners() // takes what a reread brought: no store call
	if !l.p.link.Connected() {
		return
	}
	// A reconnect stays news until the inventory is re-read for it: a
	// guard that returns early (the streams cannot be checked) leaves it
	// to the next.
	reconnects := l.p.link.Reconnects()
	reconnected := reconnects != l.ride.reconnects
	if reconnected {
		l.ride.noteReconnect(reconnects, l.p.clock.Now())
	}
	missing, invLast, err := l.p.missing(ctx, &l.ride.plansCreated)
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
	l.p.storeHoldOuts(ctx, false) // the leader's hold-outs it could not store
	stalled := l.ride.stalled(invLast, l.events != nil)
	if stalled {
		l.log.Warn().Uint64("stream", invLast).Uint64("watch", l.ride.seen).Msg("the inventory watch is stuck behind the stream (its consumer went with a server?)")
	}
	l.specsStuck(ctx)
	if l.specRecordsDue(reconnected || stalled || len(missing) > 0) {
		_ = l.checkSpecRecords(ctx)
	}
	if reconnected || stalled || len(missing) > 0 {
		l.log.Info().Bool("reconnected", reconnected).Msg("re-reading the whole inventory and the spec")
		why := "stalled_watch"
		switch {
		case len(missing) > 0:
			why = "lost_state"
		case reconnected:
			why = "reconnect"
		}
		l.p.cfg.Metrics.Resynced(why)
		l.ride.reconnects = reconnects
		l.restartWatches(ctx)
		return
	}
	l.rewatch(ctx)
}

// rewatch follows the plan and watches the spec again where either
// ended (its stream went away under it, and came back).
func (l *loop) rewatch(ctx context.Context) {
	for _, s := range l.p.all() {
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
	if l.specsIn || l.specWatched.IsZero() || l.p.since(l.specWatched) < l.p.cfg.StoreTimeout {
		return
	}
	// Records the server lists but cannot read hold the watch's end of
	// its contents back (it counts them), yet every other is delivered:
	// each is said as its plan's problem, and planning goes on.
	if l.checkSpecRecords(ctx) > 0 {
		l.log.Error().Msg("the spec watch is held back by spec records the server cannot read; planning on every other")
		l.p.problem("specs", "")
		l.specsIn = true
		l.kick()
		return
	}
	why := fmt.Sprintf("the spec bucket has not delivered its contents in %s (a damaged bucket?): no plan is made until it does", l.p.since(l.specWatched).Round(time.Second))
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
	live := map[*planState]bool{}
	for _, s := range l.p.all() {
		live[s] = true
	}
	for s := range l.following {
		if !live[s] {
			l.unfollow(s)
		}
	}
}

// missing lists the streams of the planner's state that NATS no longer
// has.
// It also returns the inventory stream's last sequence. A plan stream
// made anew since the last look (*plansCreated; another planner
// recreated it before this one noticed it gone) counts as missing: its
// sequences, the lease's among them, began again.
func (p *Service) missing(ctx context.Context, plansCreated *time.Time) ([]string, uint64, error) {
	ctx, done := p.op(ctx, "checking the streams", guardEvery)
	defer done()
	var out []string
	var invLast uint64
	for _, name := range bus.StateStreams() {
		st, err := p.link.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			out = append(out, name)
		case err != nil:
			return nil, 0, err
		case name == bus.InventoryStream:
			invLast = st.LastSeq
		case name == client.PlansStream:
			created := st.Created
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
		case "KV_" + client.DrainBucket:
			if err := p.restoreDrains(ctx); err != nil {
				return err
			}
		case "KV_" + client.SpecBucket:
			for _, s := range p.planned() {
				if err := p.restoreSpec(ctx, s); err != nil {
					return err
				}
			}
		case client.PlansStream:
			for _, s := range p.states {
				s.orphaned()
			}
			// The leader knows the newest revision; a standby may lag
			// it. The leader takes the lease again at once, a standby
			// only if the leader has not within a TTL, so the sequence
			// goes on from the newest revision there was.
			// The request is about the lease held now: one the leaser
			// takes on the new stream before it reads the request stays.
			wait := p.cfg.LeaseTTL
			seq, epoch := p.fence.held()
			if seq != 0 {
				wait = 0
			}
			l.unlead(leaseRequest{epoch: epoch, why: "the plan stream, and the lease with it, was lost", look: true, next: wait})
			l.kick()
		case "KV_" + bus.OwnersBucket:
			// Made again, and refilled with every owner this planner
			// knows once it leads (saveOwners).
			if err := p.ownerStore.Ensure(ctx); err != nil {
				return err
			}
			if p.owners != nil {
				p.owners.resave = true
			}
		case client.AssignmentsStream, "OBJ_" + client.PlansBucket:
			for _, s := range p.states {
				s.reconcile = s.latest != nil
			}
			l.armCheck(0)
		}
	}
	return nil
}

// restoreSpec puts back the spec the plan is planned on, into a spec
// bucket that was lost.
func (p *Service) restoreSpec(ctx context.Context, s *planState) error {
	spec := s.specBytes
	if spec == nil {
		return nil
	}
	// Create, not put: a spec stored since (another planner restored
	// it, someone set a new one) stays.
	kv, err := p.specs.Bucket(ctx)
	if err == nil {
		_, err = kv.Create(ctx, s.name, spec)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("restore the spec of %s: %w", s.name, err)
	}
	return nil
}

// orphaned notes that the plan stream was lost: the latest revision
// is republished whole as the next, and every assignment reconciled.
// The loop's goroutine calls it.
func (s *planState) orphaned() {
	if s.latest != nil {
		orphan := *s.latest
		orphan.Orphan = true
		s.latest = &orphan
	}
	s.reconcile = s.latest != nil
	s.assignSeq = map[string]uint64{}
}

// restartWatches re-reads the inventory (a full resync, reconciled
// against what the planner held), the spec and the drains.
func (l *loop) restartWatches(ctx context.Context) {
	// The drain watch's goroutine makes it again; the drains in force
	// stay until the new one has read the bucket.
	cue(l.p.drain.restart)
	if l.stopWatch != nil {
		l.stopWatch()
	}
	// specsIn stays: every plan's state is known; a spec stored or
	// removed meanwhile comes with the new watch, and planning the others
	// until then gives nobody's GPUs away (a new plan holds none yet, a
	// removed one still holds its own).
	l.events, l.synced, l.ride.seen, l.ride.seenAtGuard, l.ride.behind = nil, false, 0, 0, 0
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
	l.ride.noteReconnect(l.p.link.Reconnects(), l.p.clock.Now())
	for _, s := range l.p.planned() {
		if l.outageOf(s) {
			return true
		}
	}
	return false
}

// outageOf is outage for one plan's state.
func (l *loop) outageOf(s *planState) bool {
	p := l.p
	if l.ride.settlingOutage || s.latest == nil || !s.latest.Plan.Placed() || p.cfg.Settle < 0 {
		return false
	}
	// Only a node of the plan that expired and is gone counts: with none,
	// no set of the plan's 20,000 nodes is made at every replan.
	gone := false
	for id := range s.expired {
		if _, ok := p.live.doc(id); !ok {
			gone = true
			break
		}
	}
	if !gone {
		return false
	}
	nodes := map[string]bool{}
	for _, pl := range s.latest.Plan.Pools {
		for _, n := range pl.Nodes.All() {
			nodes[n.NodeID] = true
		}
	}
	lost := 0
	for id := range nodes {
		if _, ok := p.live.doc(id); !ok && s.expired[id] {
			lost++
		}
	}
	reconnected := !l.ride.reconnectedAt.IsZero() && l.p.since(l.ride.reconnectedAt) < p.cfg.Settle
	most := len(nodes) >= 2 && lost*2 > len(nodes)
	if lost == 0 || !most && !reconnected {
		return false
	}
	l.ride.settlingOutage, l.started = true, l.p.clock.Now()
	s.inherited, s.reported = s.latest.Plan, map[string]bool{}
	for _, id := range p.live.present() {
		s.reported[id] = true
	}
	why := "vanished at once (an inventory outage, not nodes leaving)"
	if reconnected {
		why = "vanished while NATS was away (their keys expired, not the nodes)"
	}
	s.note = fmt.Sprintf("%d of %d nodes %s: waited up to %s for them to report again", lost, len(nodes), why, p.cfg.Settle)
	s.log.Warn().Int("lost", lost).Int("nodes", len(nodes)).Bool("reconnected", reconnected).Str("settle", dur(p.cfg.Settle)).
		Msg("nodes of the plan vanished in an inventory outage: waiting for them to report again")
	return true
}
