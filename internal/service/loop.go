package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// loopState is the state the loop's goroutine alone holds and writes,
// without a lock: no other goroutine can name it (the Service holds
// none; TestLoopStateOwned keeps it so). Request handlers, the GPU map
// and the plans' follow goroutines read the snapshot it publishes
// (Service.snap) instead. It embeds the Service for what is shared
// (the stores, the config, the fence), so that the loop's code reads as
// the Service's.
type loopState struct {
	*Service
	// live is the live inventory; states, every plan's state by name.
	live   view
	states map[string]*planState
	// grow is since when each GPU has been free, for elastic growth
	// (grow.go).
	grow growWatch
	// rejectedNow is why each key whose document the watch refused
	// refuses it now (loopState.rejected).
	rejectedNow map[string]string
	// drain is what is out of placement on purpose (drain.go).
	drain *drains
	// health is the loop's health, which each snapshot carries
	// (liveness.go).
	health loopHealth
	// followedRetry: a replan could not read a spec history it needed
	// (followedSpec); the loop replans again a moment later.
	followedRetry bool
	// owners persists the GPU UUID owners the claims infer (owners.go):
	// the loop hands it records; its writer goroutine alone writes the
	// bucket.
	owners *ownerBook
}

// newLoopState is p's loop state before anything is read: no plans, an
// empty inventory.
func newLoopState(p *Service) *loopState {
	ls := &loopState{Service: p, live: newView(), states: map[string]*planState{},
		rejectedNow: map[string]string{}, drain: newDrains(p.clock)}
	ls.live.changed = ls.remember
	return ls
}

// loop is the planner's one goroutine: it folds inventory, spec and
// other planners' revisions into the planner's state and replans when the
// inventory has been quiet for Debounce.
type loop struct {
	p   *loopState
	log zerolog.Logger
	// followed brings the revisions of every plan, each followed by a
	// goroutine that following can stop.
	followed  chan followedPlan
	following map[*planState]context.CancelFunc
	specW     jetstream.KeyWatcher
	events    <-chan store.Event
	// synced: the watch has delivered the bucket's contents; the first
	// plan waits for it, so no plan is made on part of the inventory.
	synced     bool
	everSynced bool
	// specsIn: the spec watch delivered every stored spec; until then
	// no plan is made, lest one plan take what another, not yet read,
	// holds.
	specsIn bool
	// specRounds counts guard rounds since the spec records were last
	// checked (specRecordsDue).
	specRounds int
	// conflictKeys are the GPU UUID conflicts said as problems
	// (sayConflicts).
	conflictKeys []string
	// specWatched is when the spec watch began; specsSaid, that its
	// failure to deliver the bucket's contents was logged.
	specWatched time.Time
	specsSaid   bool
	// resync collects a (re-established) watch's initial contents.
	resync map[string]inventory.NodeInventory
	// refused are the keys a resync found refused (Service.rejectedNow).
	refused map[string]bool
	attempt int // of the inventory watch
	timer   Timer
	retry   Timer
	// check fires a moment after another planner's revision is adopted,
	// to check its assignments (Service.checkAssignments); checking says
	// it is armed, so that a busy other planner cannot postpone it.
	check    Timer
	checking bool
	// dirty: the inventory or a spec changed since the last replan;
	// armed: the replan's timer is armed (a standby's or a planner's
	// without a spec stays dirty, unarmed, until it may replan).
	dirty bool
	armed bool
	// A steady stream of changes (a rolling start of thousands of
	// reporters, a flapping GPU) must not postpone the replan for ever:
	// it waits for a quiet Debounce, but at most maxWait since the first
	// change.
	dirtySince time.Time
	maxWait    time.Duration
	started    time.Time
	// lastFailure is the cause last logged of the replans failed in a
	// row (loopHealth.failures), so a failing publish is said once, not
	// every retry.
	lastFailure string
	// standDowns counts the stand-downs since the last good replan.
	standDowns int
	// lease tends the plan's lease in a goroutine of its own; leaseDone
	// closes when it has given the lease back. (Service.led is the lease
	// the loop leads on.)
	lease     *leaser
	leaseDone chan struct{}
	// tombs writes, while this planner leads, the delete markers of
	// inventory keys that expired (tombstone.go), in a goroutine of its
	// own; tombsDone closes when it has ended.
	tombs     *tombstones
	tombsDone chan struct{}
	// guardT ticks the checks of guard (ride.go), which keeps what it
	// saw in ride; stopWatch ends the inventory watch.
	guardT    Timer
	ride      rideGuard
	stopWatch context.CancelFunc
	// snapT fires when the snapshot's inventory, held back while the
	// inventory changes fast (inventoryEvery), is to be published;
	// snapArmed says it is armed.
	snapT     Timer
	snapArmed bool
	// growT fires when a free GPU has been free for GrowAfter and an
	// elastic plan may grow onto it (grow.go): a replan then.
	growT Timer
	// followedRetries counts the replans in a row that could not read a
	// spec history they needed (loopState.followedRetry), for the
	// retry's backoff.
	followedRetries int
	// invCatch holds a plan's first revision until the inventory watch
	// has delivered what the bucket held (invcatchup.go).
	invCatch inventoryCatchUp
}

func (p *loopState) newLoop(ctx context.Context) (*loop, error) {
	// The loop plans every plan: its own lines name none, and those
	// about one plan name it once.
	l := &loop{p: p, log: p.cfg.Log, started: p.clock.Now(),
		timer: p.clock.NewTimer(time.Hour), retry: p.clock.NewTimer(0), check: p.clock.NewTimer(time.Hour), maxWait: max(10*p.cfg.Debounce, time.Second)}
	l.timer.Stop()
	l.check.Stop()
	l.lease = newLeaser(p.Service, l.log)
	l.tombs = newTombstones(p.Service, l.log)
	l.guardT = p.clock.NewTimer(p.cfg.guardRound)
	l.snapT = p.clock.NewTimer(time.Hour)
	l.snapT.Stop()
	l.growT = p.clock.NewTimer(time.Hour)
	l.growT.Stop()
	l.ride.reconnects = p.link.Reconnects()
	l.ride.outageReconnects = l.ride.reconnects
	l.followed, l.following = make(chan followedPlan, 64), map[*planState]context.CancelFunc{}
	for _, s := range p.all() {
		if err := l.follow(ctx, s); err != nil {
			return nil, err
		}
	}
	if err := l.watchSpecs(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// watchSpecs (re)starts the spec watch.
func (l *loop) watchSpecs(ctx context.Context) error {
	kctx, done := l.p.op(ctx, "opening the spec bucket", l.p.cfg.StoreTimeout)
	specKV, err := l.p.specs.Bucket(kctx)
	done()
	if err != nil {
		return err
	}
	// The watch lives as long as ctx: no deadline; guard notices one
	// that never delivers the bucket's contents.
	w, err := specKV.WatchAll(ctx)
	l.p.watched("specs", err)
	if err != nil {
		return fmt.Errorf("watch specs: %w", err)
	}
	l.specW, l.specWatched, l.specsSaid = w, l.p.clock.Now(), false
	// A removal and a put again while no watch ran (a reconnect, a watch
	// that ended) come as the put alone: each plan's first entry tells
	// whether its history is to be read again (planState.rewatched).
	for _, s := range l.p.all() {
		s.rewatched = true
	}
	return nil
}

// watched notes a try to make watch (inventory, specs): a failure is a
// problem in Health and the lease (planner status shows it) until a try
// succeeds, since the planner plans blind to what it would deliver.
func (p *loopState) watched(watch string, err error) {
	n := p.watchNote(watch, err)
	p.problem(n.key, n.msg)
}

// watchNote counts a try to make watch (inventory, specs, drains) and is
// the problem it makes or clears (msg ""); a consumer cap reached is
// named as such. The drain watch's goroutine sends it to the loop.
func (p *Service) watchNote(watch string, err error) problemNote {
	p.cfg.Metrics.Watched(watch, err != nil)
	if err == nil {
		return problemNote{key: "watch:" + watch}
	}
	why := fmt.Sprintf("cannot watch the %s: %v", watch, err)
	if atConsumerCap(err) {
		why = fmt.Sprintf("cannot watch the %s: the stream's consumers are at their cap (%v): its changes go unplanned until one is free", watch, err)
	}
	return problemNote{key: "watch:" + watch, msg: why}
}

// atConsumerCap reports whether err is the server's refusal of a
// consumer for the stream's cap: jetstream's error, or the legacy API's
// that a KV watch (kv.WatchAll, a push subscription) returns.
func atConsumerCap(err error) bool {
	var legacy *nats.APIError
	return errors.Is(err, jetstream.ErrMaximumConsumersLimit) ||
		errors.As(err, &legacy) && legacy.ErrorCode == nats.ErrorCode(jetstream.JSErrCodeMaximumConsumersLimit)
}

// followedPlan is a revision of s's plan another planner published; nil
// when the follow ended.
type followedPlan struct {
	s  *planState
	sp *store.StoredPlan
}

// follow follows s's plan into l.followed until unfollow.
func (l *loop) follow(ctx context.Context, s *planState) error {
	if _, ok := l.following[s]; ok {
		return nil
	}
	fctx, cancel := context.WithCancel(ctx)
	ch, err := l.p.followPlans(fctx, s)
	if err != nil {
		cancel()
		return err
	}
	l.following[s] = cancel
	go func() {
		for sp := range ch {
			select {
			case l.followed <- followedPlan{s, sp}:
			case <-fctx.Done():
				return
			}
		}
		select {
		case l.followed <- followedPlan{s, nil}:
		case <-fctx.Done():
		}
	}()
	return nil
}

// unfollow stops following s's plan.
func (l *loop) unfollow(s *planState) {
	if cancel, ok := l.following[s]; ok {
		cancel()
		delete(l.following, s)
	}
}

// followPlans follows the plan's revisions, skipping this planner's own
// and those it has.
func (p *Service) followPlans(ctx context.Context, s *planState) (<-chan *store.StoredPlan, error) {
	// The revision read before the follow starts (load, catchUp), which
	// the snapshot may not carry yet: the follow need not read it again.
	var have int
	if s.latest != nil {
		have = s.latest.Plan.Revision
	}
	return p.plans.Follow(ctx, s.name, func(i client.Info) bool {
		if i.Publisher == p.plans.Publisher() {
			return true // ours: replan stored it as latest already
		}
		if i.Revision <= have {
			return true
		}
		// By revision, not stream sequence: a recreated stream starts
		// its sequence again, the plan's revisions do not. (The follow's
		// goroutine reads the loop's snapshot: one that lags lets a
		// revision through that adopt then skips.)
		v := p.view().plans[s.name]
		return v.latest != nil && i.Revision <= v.latest.Plan.Revision
	})
}

func (l *loop) close() {
	for s := range l.following {
		l.unfollow(s)
	}
	_ = l.specW.Stop()
	l.timer.Stop()
	l.retry.Stop()
	l.check.Stop()
	l.guardT.Stop()
	l.snapT.Stop()
	l.growT.Stop()
	l.p.drain.timer.Stop()
	if l.stopWatch != nil {
		l.stopWatch()
	}
}

// helpers starts the loop's helper goroutines (the leaser, the
// tombstone writer, the drain watch); wait returns once all have ended,
// after ctx.
func (l *loop) helpers(ctx context.Context) (wait func()) {
	l.leaseDone, l.tombsDone = make(chan struct{}), make(chan struct{})
	go func() { defer close(l.leaseDone); l.lease.run(ctx) }()
	go func() { defer close(l.tombsDone); l.tombs.run(ctx) }()
	drainsDone := make(chan struct{})
	go func() {
		defer close(drainsDone)
		l.p.watchDrains(ctx, l.p.drain.updates, l.p.drain.restart, l.p.drain.notes)
	}()
	return func() {
		<-l.leaseDone // the lease given back
		<-l.tombsDone
		<-drainsDone
	}
}

func (l *loop) run(ctx context.Context) error {
	wait := l.helpers(ctx)
	for {
		l.enter(l.phaseNow())
		if l.p.publishSnapshot(false) && !l.snapArmed {
			l.snapArmed = true
			l.snapT.Reset(inventoryEvery)
		}
		l.p.pulse.idle()
		l.p.quiet.set(l.quiet())
		select {
		case <-ctx.Done():
			wait()
			return nil
		case ev := <-l.lease.events:
			l.work("lease")
			l.leaseChanged(ctx, ev)
		case <-l.lease.done:
			l.work("lease request done") // for quiet: nothing else to do
		case why := <-l.lease.stuck:
			l.work("the leaser's look at the loop")
			l.p.problem(stuckKey, why)
		case n := <-l.p.drain.notes:
			l.work("drain watch")
			l.p.problem(n.key, n.msg)
		case <-l.snapT.C():
			l.work("snapshot")
			l.snapArmed = false // going idle, the loop publishes the inventory as it is
		case <-l.guardT.C():
			l.work("guard")
			l.guard(ctx)
			l.guardT.Reset(l.p.cfg.guardRound)
		case <-l.retry.C():
			l.work("inventory watch")
			l.watch(ctx)
		case ev, ok := <-l.events:
			l.work("inventory event")
			if !ok {
				l.watchClosed(ctx)
				continue
			}
			l.attempt = 0
			l.ride.seen = max(l.ride.seen, ev.Revision)
			l.inventory(ev)
		case f := <-l.followed:
			l.work("another planner's revision")
			l.adopt(f)
		case <-l.check.C():
			l.work("checking assignments")
			l.checkDue(ctx)
		case e, ok := <-l.specW.Updates():
			l.work("spec")
			l.specUpdate(ctx, e, ok)
		case set := <-l.p.drain.updates:
			l.work("drains")
			l.p.drainsRead(set)
			l.kick()
		case <-l.p.drain.timer.C():
			l.work("drain deadline")
			l.p.drain.at = time.Time{}
			l.p.refreshOut()
			l.kick()
		case <-l.timer.C():
			l.work("replan")
			l.armed = false
			l.replan(ctx)
		case <-l.growT.C():
			l.work("grow")
			l.growDue()
		}
	}
}

// checkDue checks the assignments of another planner's revisions the
// loop adopted (Service.checkAssignments); a standby leaves them to the
// leader, and checks when it leads.
func (l *loop) checkDue(ctx context.Context) {
	l.checking = false
	if !l.leads() {
		return
	}
	for _, s := range l.p.all() {
		if err := l.p.checkAssignments(ctx, s); err != nil {
			s.log.Warn().Err(err).Msg("checking another planner's assignments failed; retrying")
			l.armCheck(5 * checkAfter)
		}
	}
}

// specUpdate takes what the spec watch delivered (ok false: it ended).
func (l *loop) specUpdate(ctx context.Context, e jetstream.KeyValueEntry, ok bool) {
	if ok {
		l.spec(ctx, e)
		return
	}
	if ctx.Err() != nil {
		return // stopping: the watch ends with us
	}
	// The spec bucket went away under the watch: guard recreates it and
	// watches again.
	l.log.Error().Msg("the spec watch ended; re-establishing it")
	l.specW = stoppedWatch{}
}

// leads says whether this planner leads: it holds the lease, and the
// loop has read every plan's latest revision since it took that very
// lease (Service.leads).
func (l *loop) leads() bool { return l.p.leads() }

// armReplan arms the replan's timer to fire after d.
func (l *loop) armReplan(d time.Duration) {
	l.armed = true
	l.timer.Reset(d)
}

// unlead stops the loop leading, at once, and asks the leaser to stop
// holding the lease (r): the loop never waits on the leaser, which may
// be in a renewal.
func (l *loop) unlead(r leaseRequest) {
	l.invCatch = inventoryCatchUp{} // a wait begins again when it leads again
	l.p.led.Store(0)
	l.lease.ask(r)
}

// leaseChanged acts on what became of the lease. A lease taken is led on
// once every plan's latest revision is read as the stream's leader has
// it, so that this planner continues each plan's sequence from the last
// revision whoever led before published; a lease lost ends leading.
func (l *loop) leaseChanged(ctx context.Context, ev leaseEvent) {
	l.invCatch = inventoryCatchUp{} // a first revision's wait begins again when it leads
	if ev.seq == 0 {
		l.p.led.Store(0)
		l.ride.settlingOutage = false // a settle is the next leader's to judge
		for _, s := range l.p.states {
			s.note = ""
		}
		l.p.leaderGauges()
		return
	}
	// Read again even when the loop led already: a lease lost and taken
	// again since the last event read is one event (leaser.tell), and
	// another planner may have led in between.
	l.p.led.Store(0)
	cctx, done := l.p.op(ctx, "reading every plan's latest revision", l.p.readTimeout(l.p.all()...))
	err := l.p.catchUpAll(cctx)
	done()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		// Leading on a stale latest would fork the history (the message
		// id check aside): give the lease back and try again.
		l.log.Warn().Err(err).Msg("took the lease but cannot read the latest revision; giving it back")
		l.unlead(leaseRequest{epoch: ev.epoch, why: "took the lease but cannot read the latest revision", release: true})
		return
	}
	// Led on this epoch only: should the lease have changed since the
	// event, the fence refuses to publish on it (Service.leads) until
	// the loop catches up on the next event.
	l.p.led.Store(ev.epoch)
	// Whoever led may have died between a revision and its assignments.
	for _, s := range l.p.states {
		s.reconcile = s.latest != nil
	}
	l.p.leaderGauges()
	cue(l.tombs.wake) // the expiries noticed as a standby are this planner's to mark now
	// Failures as a standby (a replan refused for the lease) are no
	// leader's: start afresh, so that kick arms the replan.
	l.p.health.failures, l.lastFailure = 0, ""
	l.armCheck(0)
	// Held out as a standby, or unstored by the leader before.
	l.p.storeHoldOuts(ctx, true)
	l.kick() // publishes only if the inventory changed meanwhile
}

// catchUpAll is catchUp for every plan.
func (p *loopState) catchUpAll(ctx context.Context) error {
	for _, s := range p.all() {
		if err := p.catchUp(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// catchUp makes plan s's latest revision the one the stream's leader has
// last (a direct get may be answered by a replica that lags; a standby's
// follow may be behind), waiting a moment for one not readable yet.
func (p *loopState) catchUp(ctx context.Context, s *planState) error {
	lastEv, err := p.plans.LastEvent(ctx, client.PlanEventSubject(s.name))
	last := lastEv.Seq
	if err != nil || last == 0 {
		return err
	}
	if s.latest != nil && !s.latest.Unreadable && s.latest.Seq == last && s.latest.Plan != nil && s.latest.Plan.Revision == lastEv.Revision {
		// Read already (at start, before the lease was taken): adopting
		// it again would change nothing, and reading it again costs a
		// whole plan's decode (some 240 MB allocated at 20,000 nodes)
		// while the planner holds everything else. The revision too, not
		// the sequence alone: a plan stream made again since whose last
		// event landed on the same sequence holds another revision.
		return nil
	}
	for attempt := 0; ; attempt++ {
		sp, err := p.plans.Latest(ctx, s.name)
		if err != nil {
			return err
		}
		if sp != nil && sp.Seq >= last {
			p.adopted(s, sp)
			return nil
		}
		if attempt >= 20 {
			return fmt.Errorf("plan %s: revision at stream sequence %d not readable yet", s.name, last)
		}
		wait, stop := p.after(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			stop()
			return ctx.Err()
		case <-wait:
		}
	}
}

// adopt takes another planner's revision of a plan, or notes that its
// follow ended (guard follows again).
func (l *loop) adopt(f followedPlan) {
	if _, ok := l.following[f.s]; !ok {
		return // stopped following
	}
	if f.sp == nil {
		l.unfollow(f.s)
		return
	}
	l.p.adopted(f.s, f.sp)
	l.armCheck(checkAfter)
}

// checkAfter is how long after adopting another planner's revision its
// assignments are checked: that planner publishes them right after the
// event.
const checkAfter = 2 * time.Second

// armCheck arms the assignment check unless it is armed already.
func (l *loop) armCheck(after time.Duration) {
	if !l.checking {
		l.checking = true
		l.check.Reset(after)
	}
}

// kick notes a change and arms the replan.
func (l *loop) kick() {
	if !l.dirty {
		l.dirtySince = l.p.clock.Now()
	}
	l.dirty = true
	haveSpec := len(l.p.planned()) > 0
	if l.synced && l.specsIn && l.p.drain.in && haveSpec && l.p.health.failures == 0 {
		l.armReplan(max(0, min(l.p.cfg.Debounce, l.maxWait-l.p.since(l.dirtySince))))
	}
}

// watch (re)starts the inventory watch.
func (l *loop) watch(ctx context.Context) {
	if l.stopWatch != nil {
		l.stopWatch()
	}
	wctx, stop := context.WithCancel(ctx)
	l.stopWatch = stop
	ch, err := l.p.inv.Watch(wctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		l.log.Error().Err(err).Msg("the inventory bucket is gone; recreating it")
		ectx, done := l.p.op(ctx, "recreating the inventory bucket", l.p.cfg.StoreTimeout)
		_, err = l.p.inv.Ensure(ectx)
		done()
		if err == nil {
			ch, err = l.p.inv.Watch(wctx)
		}
	}
	l.p.watched("inventory", err)
	if err != nil {
		l.log.Warn().Err(err).Msg("inventory watch failed; retrying")
		l.retry.Reset(bus.Backoff(l.attempt))
		l.attempt++
		return
	}
	l.events, l.resync, l.refused = ch, map[string]inventory.NodeInventory{}, map[string]bool{}
}

// watchClosed starts over with a full resync when the watch ends without
// being asked to, so that nothing that happened meanwhile is missed.
func (l *loop) watchClosed(ctx context.Context) {
	l.events, l.synced = nil, false
	if ctx.Err() == nil {
		l.log.Warn().Msg("inventory watch closed; re-establishing")
		l.p.cfg.Metrics.Resynced("watch_ended") // the next watch reads it all
		l.retry.Reset(bus.Backoff(l.attempt))
		l.attempt++
	}
}

// inventory folds one watch event in.
func (l *loop) inventory(ev store.Event) {
	l.tombs.event(ev)
	if l.resync == nil {
		if l.p.apply(ev) {
			l.kick()
		}
		return
	}
	switch ev.Op {
	case store.Changed:
		delete(l.p.rejectedNow, ev.NodeID)
		l.resync[ev.NodeID] = ev.Inventory
	case store.Heartbeat:
		// A heartbeat of a key this watch has not shown: what we knew is
		// all there is. Never overwrite the fresher value this watch
		// delivered.
		if _, seen := l.resync[ev.NodeID]; !seen {
			if old, ok := l.p.node(ev.NodeID); ok {
				l.resync[ev.NodeID] = old
			}
		}
	case store.Removed:
		delete(l.p.rejectedNow, ev.NodeID)
		delete(l.resync, ev.NodeID)
	case store.Rejected:
		delete(l.resync, ev.NodeID)
		l.refused[ev.NodeID] = true
		l.p.rejected(ev)
	case store.Synced:
		// A key refused before and not in this read is gone: should it
		// come back refused, that is news.
		maps.DeleteFunc(l.p.rejectedNow, func(id, _ string) bool { return !l.refused[id] })
		defer l.p.allow("applying the whole inventory", l.p.storeTimeout(len(l.resync)))()
		l.tombs.vanished(l.vanished())
		l.p.replaceNodes(l.resync)
		if !l.everSynced {
			for _, s := range l.p.all() {
				l.p.afterFirstSync(s)
			}
		}
		l.resync, l.synced, l.everSynced = nil, true, true
		l.kick()
	}
}

// vanished lists the nodes of the live inventory that a resync's
// contents lack: gone while the watch was away.
func (l *loop) vanished() []string {
	var out []string
	for _, id := range l.p.live.present() {
		if _, ok := l.resync[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// spec takes a stored spec, of any plan: the key names it. One that
// does not parse keeps the last good one; with none yet (a planner
// started without --spec), the newest good one in the bucket's history.
// A removed spec releases its plan's workers at the next replan.
func (l *loop) spec(ctx context.Context, e jetstream.KeyValueEntry) {
	if e == nil {
		l.p.problem("specs", "")
		l.specsIn = true // the initial values are in
		l.kick()
		return
	}
	name := e.Key()
	if store.ValidatePlanName(name) != nil {
		l.log.Warn().Str("key", name).Msg("a spec key that is no plan name; ignored")
		return
	}
	s := l.p.state(name)
	log := l.log.With().Str("plan", name).Logger()
	// A record delivered is one the bucket can read.
	l.p.problem("spec-record:"+name, "")
	if s != nil {
		s.recordLost = ""
		if s.rewatched {
			// A put of another revision than the one planned on may
			// follow a removal the watch never delivered: the latest is
			// checked against the history again, as at a restart
			// (removedSince). The same revision is the spec unchanged.
			s.rewatched = false
			if e.Operation() == jetstream.KeyValuePut && e.Revision() != s.specRev {
				s.removalChecked = nil
				// A removal in the gap is taken as if the watch had
				// delivered it, before the put: a put that does not
				// parse then keeps nothing (lastGoodSpec stops at the
				// marker), as for a planner whose watch stayed up
				// (review rev16), not the spec the user deleted.
				// (Only past a spec in force: a plan without one is
				// planned afresh by the put anyway, its latest checked
				// by removedSince.)
				if s.spec != nil && s.specRev != 0 {
					if at := l.removalBetween(ctx, name, s.specRev, e.Revision()); at != 0 {
						l.removed(ctx, s, name, at, log)
						// A plan with nothing to release is dropped by it:
						// the put makes it anew, as after a delivered one.
						s = l.p.state(name)
					}
				}
			}
		}
	}
	if e.Operation() != jetstream.KeyValuePut {
		l.removed(ctx, s, name, e.Revision(), log)
		return
	}
	if s == nil {
		s = l.addState(ctx, name, l.firstRevision(ctx, name, e.Revision()))
	}
	spec, value, rev := l.parsed(ctx, s, e, log)
	if spec == nil {
		return
	}
	// Stored again before the removal was published (one replan takes
	// both): the removal, its marker's revision kept by removed
	// (planState.removedAt), is published still, then the spec planned
	// afresh, as when the removal had a replan of its own; unless the
	// latest was planned on a put after the marker (removedSince).
	fresh := s.spec == nil || s.removing
	var age uint64
	if fresh {
		// New, or stored again after its removal: it is as old as this
		// run of puts.
		age = l.firstRevision(ctx, name, rev)
	}
	if fresh {
		s.age = age
	}
	s.spec, s.digest, s.specBytes, s.removing, s.specRev = spec, SpecDigest(spec), value, false, rev
	if fresh {
		l.p.leaderGauges() // a plan this planner plans from now on
	}
	log.Info().Uint64("spec_revision", rev).Int("priority", spec.Priority).Msg("spec loaded")
	l.kick()
}

// removed takes the removal of plan name's spec (s: its state, nil if
// none), maybe while no planner ran: the plan's last revision, if it
// does not say the plan was removed, is to release its workers and say
// so (load reads it). A plan whose last revision says so already (or
// that has none) was removed before: there is nothing to release, and
// nothing to say at every start.
//
// at is the removal marker's bucket revision: a removal applies only to
// a revision planned on a spec stored before it, never to one a planner
// published on a put after it (a watch behind the plan stream delivers
// it late: review rev13).
func (l *loop) removed(ctx context.Context, s *planState, name string, at uint64, log zerolog.Logger) {
	if s == nil {
		s = l.addState(ctx, name, 0)
	}
	l.p.problem("spec:"+name, "")
	done := s.loaded && (s.latest == nil || s.latest.Plan.Removed())
	live := s.spec != nil
	if !done {
		s.removing, s.removedAt = true, at
	}
	if !done {
		log.Info().Msg("spec removed: releasing the plan's workers")
		l.kick()
		return
	}
	l.unfollow(s)
	l.p.drop(s)
	if live {
		// Planned in this run, but never published: nothing held.
		log.Info().Msg("spec removed; the plan held nothing")
		l.kick()
	}
}

// parsed is the spec e stores for s's plan; one that does not parse
// keeps the last good one (nil: keep it), or, with none yet, the newest
// good one in the key's history.
func (l *loop) parsed(ctx context.Context, s *planState, e jetstream.KeyValueEntry, log zerolog.Logger) (*planner.Spec, []byte, uint64) {
	spec, err := planner.ParseSpec(e.Value())
	if err == nil {
		l.p.problem("spec:"+e.Key(), "")
		return spec, e.Value(), e.Revision()
	}
	l.p.problem("spec:"+e.Key(), fmt.Sprintf("plan %s: stored spec revision %d does not parse: %v", e.Key(), e.Revision(), err))
	have := s.spec != nil
	if have {
		log.Error().Err(err).Uint64("spec_revision", e.Revision()).Msg("stored spec does not parse; keeping the last one")
		return nil, nil, 0
	}
	spec, value, rev := l.lastGoodSpec(ctx, e.Key(), e.Revision())
	if spec == nil {
		log.Error().Err(err).Uint64("spec_revision", e.Revision()).Msg("stored spec does not parse, nor does any before it: no plan until a good one is stored (planner spec set)")
		return nil, nil, 0
	}
	log.Error().Err(err).Uint64("spec_revision", e.Revision()).Uint64("planning_on", rev).Msg("stored spec does not parse; planning on the last good one")
	return spec, value, rev
}

// addState makes plan name's state, reads its latest revision and
// follows it.
func (l *loop) addState(ctx context.Context, name string, age uint64) *planState {
	s := l.p.addState(name)
	s.age = age
	if err := l.p.load(ctx, s); err != nil {
		s.log.Warn().Err(err).Msg("cannot read the plan's latest revision yet; retrying")
	}
	if err := l.follow(ctx, s); err != nil {
		s.log.Warn().Err(err).Msg("cannot follow the plan yet; retrying")
	}
	return s
}

// firstRevision is the revision at which plan name's spec was first
// stored since it was last removed (its age among plans of one
// priority); rev if the history cannot be read.
func (l *loop) firstRevision(ctx context.Context, name string, rev uint64) uint64 {
	hist, err := l.p.specHistory(ctx, name)
	if err != nil {
		l.log.Error().Err(err).Str("plan", name).Uint64("spec_revision", rev).
			Msg("cannot read the history of the plan's spec (a damaged spec bucket?): its age among plans of its priority is taken as this revision")
		l.p.problem("spec-history:"+name, fmt.Sprintf("plan %s: cannot read its spec's history: %v", name, err))
		return rev
	}
	l.p.problem("spec-history:"+name, "")
	first := rev
	for i := len(hist) - 1; i >= 0 && hist[i].Operation() == jetstream.KeyValuePut; i-- {
		first = hist[i].Revision()
	}
	return first
}

// specHistory reads the history of plan name's spec, within the store's
// deadline: a damaged bucket can leave the read waiting for ever.
func (p *loopState) specHistory(ctx context.Context, name string) ([]jetstream.KeyValueEntry, error) {
	ctx, done := p.op(ctx, "reading the history of plan "+name+"'s spec", p.cfg.StoreTimeout)
	defer done()
	kv, err := p.specs.Bucket(ctx)
	if err != nil {
		return nil, err
	}
	// Asked of a key the watch delivered: "not found" is a replica that
	// has not stored it yet answering the history's consumer (a forming
	// cluster); another consumer is placed anew.
	var hist []jetstream.KeyValueEntry
	for try := 0; try < 3; try++ {
		if hist, err = kv.History(ctx, name); !errors.Is(err, jetstream.ErrKeyNotFound) || try == 2 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond << try):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("history of spec %s: %w", name, err)
	}
	return hist, nil
}

// removalBetween is the bucket revision of the newest removal marker of
// plan name's spec after revision from and before revision to; 0 if
// none, or if the history cannot be read (logged: the replan's own
// check, removedSince, reads it again).
func (l *loop) removalBetween(ctx context.Context, name string, from, to uint64) uint64 {
	hist, err := l.p.specHistory(ctx, name)
	if err != nil {
		l.log.Warn().Err(err).Str("plan", name).Msg("cannot read the history of the plan's spec to tell whether it was removed while the spec watch was away")
		return 0
	}
	return newestRemoval(hist, from, to)
}

// newestRemoval is the bucket revision of the newest removal marker in
// hist (a key's history, oldest first) after revision from and before
// revision to (0: no bound); 0 if none.
func newestRemoval(hist []jetstream.KeyValueEntry, from, to uint64) uint64 {
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		switch {
		case to != 0 && e.Revision() >= to:
		case e.Revision() <= from:
			return 0
		case e.Operation() != jetstream.KeyValuePut:
			return e.Revision()
		}
	}
	return 0
}

// lastGoodSpec is the newest stored spec of plan name before revision
// bad that parses, since the spec was last removed; nil if none. (One
// before a removal marker is a spec the user deleted: planned on again,
// a bad put after the delete would bring it back.)
func (l *loop) lastGoodSpec(ctx context.Context, name string, bad uint64) (*planner.Spec, []byte, uint64) {
	hist, err := l.p.specHistory(ctx, name)
	if err != nil {
		l.log.Error().Err(err).Str("plan", name).Msg("cannot read the history of the plan's spec (a damaged spec bucket?) to find a good one")
		return nil, nil, 0
	}
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		if e.Revision() >= bad {
			continue
		}
		if e.Operation() != jetstream.KeyValuePut {
			return nil, nil, 0
		}
		if spec, err := planner.ParseSpec(e.Value()); err == nil {
			return spec, e.Value(), e.Revision()
		}
	}
	return nil, nil, 0
}

// stoppedWatch stands in for a spec watch that ended, until guard
// watches again.
type stoppedWatch struct{}

func (stoppedWatch) Updates() <-chan jetstream.KeyValueEntry { return nil }
func (stoppedWatch) Stop() error                             { return nil }

// measured replans every plan and records, per plan, the replan's time
// and, for those it published, the time since the first change.
func (l *loop) measured(ctx context.Context) error {
	before := map[*planState]int{}
	for _, s := range l.p.planned() {
		before[s] = l.p.revisionOf(s)
	}
	start := l.p.clock.Now()
	err := l.p.replan(ctx)
	if err != nil {
		return err
	}
	took := l.p.since(start)
	// A plan removed by this replan has no series any more: none begins
	// again.
	planned := map[*planState]bool{}
	for _, s := range l.p.planned() {
		planned[s] = true
	}
	for s, rev := range before {
		if !planned[s] {
			continue
		}
		var since time.Duration
		if l.p.revisionOf(s) != rev {
			since = l.p.since(l.dirtySince)
		}
		l.p.cfg.Metrics.Replanned(s.name, took, since)
	}
	l.p.cfg.Metrics.Inventory(l.p.inventorySize())
	return nil
}

// settling is the longest any plan waits for its nodes (planState.settling).
func (l *loop) settling() time.Duration {
	var wait time.Duration
	for _, s := range l.p.states {
		wait = max(wait, s.settling(l.p.cfg.Settle-l.p.since(l.started)))
	}
	return wait
}

// unreported is every plan's nodes not heard from (planState.unreported).
func (l *loop) unreported() []string {
	var ids []string
	for _, s := range l.p.states {
		for _, id := range s.unreported() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// replan plans and publishes when the inventory has settled; a failure
// backs off, and is logged once per cause, while the last good plan keeps
// being served.
func (l *loop) replan(ctx context.Context) {
	if !l.dirty {
		return
	}
	if !l.leads() {
		return // a standby replans when it takes the lease
	}
	l.outage()
	if wait := l.settling(); wait > 0 {
		if !l.ride.settleWaiting {
			l.ride.settleWaiting = true
			ids := l.unreported()
			l.log.Info().Int("nodes", len(ids)).Strs("waiting_for", ids[:min(len(ids), 8)]).Str("at_most", dur(wait)).
				Msg("waiting for the nodes of the plan found at start to report before replanning without them")
		}
		l.armReplan(wait)
		return
	}
	l.ride.settleWaiting = false
	if wait := l.inventoryBehind(ctx); wait > 0 {
		l.armReplan(wait)
		return
	}
	l.dirty = false
	// Readers see at least the inventory a revision was planned on,
	// once the stream has it.
	l.p.publishSnapshot(true)
	err := l.measured(ctx)
	l.prune()
	if errors.Is(err, bus.ErrLeaseLost) {
		l.dirty = true
		// The lease this loop led on, if the leaser holds it still; one
		// taken since is led on once the loop catches up on it.
		l.unlead(leaseRequest{epoch: l.p.led.Load(), why: err.Error()})
		return
	}
	if l.p.checkPending() {
		l.armCheck(checkAfter) // it adopted another planner's revision
	}
	if err == nil {
		// The next plan to come due asks the bucket afresh.
		l.invCatch = inventoryCatchUp{}
		l.armGrow()
		if l.ride.settlingOutage {
			// Said in the revision, or nothing moved and nothing needs
			// saying.
			l.ride.settlingOutage = false
			for _, s := range l.p.states {
				s.note = ""
			}
		}
		if l.p.health.failures > 0 {
			l.log.Info().Int("failures", l.p.health.failures).Msg("replanned after failures")
		}
		l.p.health.failures, l.lastFailure, l.standDowns = 0, "", 0
		l.p.stoodDownFor("", time.Time{})
		if l.p.followedRetry {
			// A placement kept unchecked for want of its spec's history:
			// checked as soon as the history reads, backing off while it
			// does not (up to a minute). A change meanwhile waits its
			// debounce as any does: the retry is dirty since now.
			l.p.followedRetry = false
			l.dirty, l.dirtySince = true, l.p.clock.Now()
			l.armReplan(min(followedRetryAfter<<min(l.followedRetries, 5), time.Minute))
			l.followedRetries++
		} else {
			l.followedRetries = 0
		}
		return
	}
	if ctx.Err() != nil {
		return // stopping: a replan cut short is no failure
	}
	l.dirty = true
	wait := bus.Backoff(l.p.health.failures + 3) // from about 1 s up to 5 s
	l.p.health.failures++
	if l.p.health.failures >= l.p.cfg.StandDownAfter {
		l.standDown(err)
		return
	}
	if cause := err.Error(); cause != l.lastFailure {
		l.log.Error().Err(err).Str("retry_in", dur(wait)).Msg("replan failed; retrying, serving the last plan meanwhile")
		l.lastFailure = cause
	}
	l.armReplan(wait)
}

// DefaultStandDownAfter is how many replans in a row may fail before a
// leading planner stands down; DefaultStandDownBackoff, how long it then
// leaves leading to others (doubling at each stand-down in a row, up to
// maxStandDown). With replans retried 1 s to 5 s apart, a planner whose
// writes all fail stands down after about 15 s.
const (
	DefaultStandDownAfter   = 5
	DefaultStandDownBackoff = 30 * time.Second
	maxStandDown            = 10 * time.Minute
)

// standDown gives the lease up after StandDownAfter replans failed in a
// row, says why, and keeps this planner from leading for a while
// (growing while it keeps standing down): a planner whose writes fail
// (its store lost, full or refusing) must not hold the lease that keeps
// a working planner from leading. It tries again after the wait.
func (l *loop) standDown(err error) {
	l.standDowns++
	wait := min(l.p.cfg.StandDownBackoff<<min(l.standDowns-1, 16), maxStandDown)
	why := fmt.Sprintf("%d replans in a row failed, the last with: %v", l.p.health.failures, err)
	l.log.Error().Err(err).Int("failures", l.p.health.failures).Str("lead_again_in", dur(wait)).
		Msg("standing down: replans keep failing against the store; giving the lease up so that another planner leads")
	l.p.stoodDownFor(why, l.p.clock.Now().Add(wait))
	// Given up (writes failing: the release may fail too, and the lease
	// then lapses unrenewed), and none taken for wait.
	l.unlead(leaseRequest{anyLease: true, why: "replans keep failing: " + why, release: true, hold: wait, look: true, next: wait})
	l.p.health.failures, l.lastFailure = 0, ""
}
