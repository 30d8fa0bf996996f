package service

import (
	"context"
	"sync/atomic"
)

// phase is where the planner's loop stands. The loop derives it in one
// place (loop.phaseNow) from what it knows, each time it goes idle, and
// says each change (loop.enter); Health reports it.
type phase int32

const (
	// phaseSyncing: the inventory watch or the spec watch has not yet
	// delivered all there is (at start, after a reconnect or a lost
	// watch): no plan is made on part of it.
	phaseSyncing phase = iota
	// phaseStandingBy: another planner leads (or this one has not read
	// the latest revisions since it took the lease); this one follows
	// the revisions and the inventory.
	phaseStandingBy
	// phaseSettling: leading, it waits for the nodes of the plans found
	// at start, or lost in an outage, to report before replanning
	// without them (at most Settle).
	phaseSettling
	// phaseBackingOff: leading, replans failed; the next waits a backoff,
	// and enough failures in a row stand it down.
	phaseBackingOff
	// phaseLeading: it replans and publishes as the inventory and the
	// specs change.
	phaseLeading
)

func (ph phase) String() string {
	switch ph {
	case phaseSyncing:
		return "syncing"
	case phaseStandingBy:
		return "standing by"
	case phaseSettling:
		return "settling"
	case phaseBackingOff:
		return "backing off"
	case phaseLeading:
		return "leading"
	}
	return "unknown"
}

// phaseNow is the phase the loop is in.
func (l *loop) phaseNow() phase {
	switch {
	case !l.synced || !l.specsIn || !l.p.drain.in:
		// The drains are part of what a plan may use: answering a
		// validation before they are read would offer drained GPUs.
		return phaseSyncing
	case !l.leads():
		return phaseStandingBy
	case l.p.health.failures > 0:
		return phaseBackingOff
	case l.ride.settleWaiting:
		return phaseSettling
	}
	return phaseLeading
}

// work notes that the loop took up an event (what): it is busy.
func (l *loop) work(what string) {
	l.p.quiet.set(false)
	l.p.pulse.work(what)
}

// quiet says whether the loop, going idle, has nothing pending: the
// inventory and the specs are in, no replan and no check of assignments
// is armed, no request to the leaser is being done, and no event it
// has been sent waits to be read. A change a standby (or a planner
// without a spec) cannot replan on leaves it dirty, and quiet: no replan
// is armed.
func (l *loop) quiet() bool {
	// The requests first: the leaser tells their events before it counts
	// them done, so that none is missed below.
	asked := l.lease.pending.Load() != 0
	return !asked && l.p.health.phase != phaseSyncing && !l.armed && !l.checking && !l.snapArmed &&
		len(l.followed) == 0 && len(l.events) == 0 && len(l.lease.events) == 0 &&
		len(l.lease.stuck) == 0 && len(l.p.drain.notes) == 0
}

// quiet is closed while the loop is idle with nothing pending
// (loop.quiet), for Service.Idle. The loop's goroutine alone sets it
// and alone uses closed; Idle reads the channel, which set closes, or
// replaces by an open one, without a lock.
type quiet struct {
	ch     atomic.Pointer[chan struct{}]
	closed bool
}

// current is the channel closed while the loop is quiet, made by the
// first to ask (Idle may ask before the loop first sets it).
func (q *quiet) current() chan struct{} {
	if c := q.ch.Load(); c != nil {
		return *c
	}
	c := make(chan struct{})
	if q.ch.CompareAndSwap(nil, &c) {
		return c
	}
	return *q.ch.Load()
}

// set marks the loop quiet or not.
func (q *quiet) set(on bool) {
	switch {
	case on && !q.closed:
		close(q.current())
		q.closed = true
	case !on && q.closed:
		c := make(chan struct{})
		q.ch.Store(&c)
		q.closed = false
	}
}

// wait is a channel closed when the loop is quiet.
func (q *quiet) wait() <-chan struct{} { return q.current() }

// Idle returns once the planner's loop is idle with nothing pending
// (every watch delivered what there is, no replan and no check of
// assignments armed, no request to the leaser being done, no event
// waiting to be read), or with ctx's error. A standby, or a planner
// without a spec, that saw a change it does not replan on is idle.
// It knows nothing of events still on their way to the planner: a test
// that caused one waits for its effect first (a revision, a metric),
// then for Idle to say nothing more follows from it.
func (p *Service) Idle(ctx context.Context) error {
	select {
	case <-p.quiet.wait():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enter makes ph the loop's phase, saying a change.
func (l *loop) enter(ph phase) {
	if ph == l.p.health.phase {
		return
	}
	l.log.Debug().Stringer("from", l.p.health.phase).Stringer("to", ph).Msg("phase")
	l.p.health.phase = ph
}
