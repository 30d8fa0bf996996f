package service

import (
	"context"
	"time"
)

// inventoryCatchUp keeps a plan's first revision from being planned on
// an inventory the watch has not finished delivering. The spec and the
// inventory come on two watches of two streams, with no order between
// them: a planner that leads while another process both reported its
// nodes and then stored the spec (the README's HA recipe: `serve
// --simulate` on one server, the planner leading on another) can see the
// spec first, and would publish a first plan on the first few nodes,
// invalid or squeezed, then replan it a moment later. The wait holds
// the replan back, every plan's, but only while a first revision is due
// and the watch is behind the bucket (on a watch that keeps up it passes
// at once); a replan with no first revision due is not held: its plans'
// nodes are their own, and settling (planState.settling) waits for
// those. Its state is dropped after each replan that published and when
// the loop stops leading, so each plan that comes due asks afresh. The
// loop's goroutine alone holds it.
type inventoryCatchUp struct {
	// target is the bucket's last revision, asked when a first plan came
	// due (asked says it was); since, when.
	target uint64
	asked  bool
	since  time.Time
	// said: the wait was logged.
	said bool
}

// inventoryCatchUpMax bounds the wait for the watch: a last message the
// watch never delivers (a key whose TTL removed it from the stream, a
// refused node's heartbeat) must not hold a first plan up for long.
const inventoryCatchUpMax = 5 * time.Second

// inventoryCatchUpPoll is how often a waiting replan looks again: a
// heartbeat delivered changes no plan and kicks no replan.
const inventoryCatchUpPoll = 100 * time.Millisecond

// firstDue says whether a plan with a spec is yet to publish its first
// revision.
func (l *loop) firstDue() bool {
	for _, s := range l.p.planned() {
		if s.spec != nil && !s.removing && s.latest == nil {
			return true
		}
	}
	return false
}

// inventoryBehind is how long the replan should wait for the inventory
// watch to deliver what the bucket held when a first plan came due (0:
// plan now). A bucket that cannot be asked holds nothing up: the plan
// is made on what was delivered, as before.
func (l *loop) inventoryBehind(ctx context.Context) time.Duration {
	c := &l.invCatch
	if !l.firstDue() {
		c.asked, c.said = false, false
		return 0
	}
	if !c.asked {
		octx, done := l.p.op(ctx, "reading the inventory bucket's last revision", l.p.cfg.StoreTimeout)
		target, err := l.p.inv.LastRevision(octx)
		done()
		c.asked, c.since = true, l.p.clock.Now()
		if err != nil {
			l.log.Debug().Err(err).Msg("cannot read the inventory bucket's last revision; planning on the inventory delivered")
			c.target = 0
			return 0
		}
		c.target = target
	}
	seen := l.ride.seen // the newest revision the watch delivered
	if seen >= c.target {
		return 0
	}
	left := inventoryCatchUpMax - l.p.since(c.since)
	if left <= 0 {
		if c.said {
			l.log.Info().Uint64("delivered", seen).Uint64("bucket", c.target).
				Msg("the inventory watch is still behind the bucket; planning on what it delivered")
		}
		c.target = 0
		return 0
	}
	if !c.said {
		c.said = true
		l.log.Info().Uint64("delivered", seen).Uint64("bucket", c.target).Str("at_most", dur(left)).
			Msg("waiting for the inventory watch to deliver the bucket's contents before a plan's first revision")
	}
	return min(left, inventoryCatchUpPoll)
}
