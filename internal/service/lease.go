package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// DefaultLeaseTTL is how long a leading planner's lease lasts unrenewed:
// a standby takes over this long (and a poll) after the leader dies. It
// renews every third of it, so a leader rides out a NATS hiccup of two
// renewals.
const DefaultLeaseTTL = 5 * time.Second

// leaser keeps the planner's side of the plan's lease in a goroutine of
// its own: a leader busy for longer than the TTL (publishing the first
// plan of a large cluster) still renews, and only a planner that stops
// altogether (dead, paused, cut off) loses the lease. It owns the
// lease's timing and every field below, and alone writes Service.fence's
// sequence and epoch. It tells the loop what became of the lease
// (events), and the loop acts on it; the loop asks it to step down,
// give the lease back or stand down (requests), which it does in its
// own goroutine.
type leaser struct {
	p   *Service
	log zerolog.Logger
	// since is when this planner took the lease; renewed, when the
	// stream last confirmed it (this host's clock).
	since, renewed time.Time
	// holder is the last other holder seen, so a change is logged once;
	// seen is the other holder's lease message last seen and seenAt when
	// it was first seen (this host's clock): one unchanged for a whole
	// TTL was not renewed, whatever the server's expiry says yet.
	holder string
	seen   uint64
	seenAt time.Time
	// said is what was logged of the holder: "predecessor" (this
	// planner's own, left behind) or "other" (another planner leads).
	said  string
	timer Timer
	// events tell the loop that the lease was taken or lost, never
	// blocking: a newer event replaces one the loop has not read.
	events chan leaseEvent
	// reqs are the loop's requests not yet taken up, under reqMu
	// (innermost: nothing is locked while it is held); asked cues the
	// leaser's goroutine, their only doer, to do them; pending counts
	// those asked and not yet done, and done cues the loop as they are
	// (Idle waits for them).
	reqMu   sync.Mutex
	reqs    []leaseRequest
	asked   chan struct{}
	pending atomic.Int32
	done    chan struct{}
	// holdUntil: a planner that stood down (its writes failing) takes
	// no lease before then. stuckSaid: the loop being stuck was logged
	// and told to the loop on stuck (why; "": it makes progress again),
	// never blocking: a newer word replaces one the loop has not read.
	holdUntil time.Time
	stuckSaid bool
	stuck     chan string
}

func newLeaser(p *Service, log zerolog.Logger) *leaser {
	return &leaser{p: p, log: log, timer: p.clock.NewTimer(0), events: make(chan leaseEvent, 1),
		asked: make(chan struct{}, 1), done: make(chan struct{}, 1), stuck: make(chan string, 1)}
}

// leaseEvent is what became of the lease: taken at stream sequence seq,
// or, seq 0, lost (given up, taken over, lapsed); epoch is the fence's
// epoch it made (fence).
type leaseEvent struct {
	seq, epoch uint64
	why        string
}

// leaseRequest is what the loop asks of the leaser: to stop leading on
// lease epoch (another epoch than the one held: nothing, that lease is
// gone already, and one taken after the loop asked is not the one it
// asked about), or with anyLease on whatever lease it holds, for why;
// release: give the lease back (else it lapses, or is lost already);
// hold: take none for that long (a stand-down); look: look at the lease
// next after next (sooner while a lease is held: it is renewed on time).
type leaseRequest struct {
	epoch    uint64
	anyLease bool
	why      string
	release  bool
	hold     time.Duration
	look     bool
	next     time.Duration
}

// ask asks the leaser's goroutine to do r, without waiting for it: the
// loop must not wait on a renewal in flight.
func (ls *leaser) ask(r leaseRequest) {
	ls.reqMu.Lock()
	ls.reqs = append(ls.reqs, r)
	ls.reqMu.Unlock()
	ls.pending.Add(1)
	cue(ls.asked)
}

// requests does the loop's requests, in the order asked: their events
// told before they count as done.
func (ls *leaser) requests(ctx context.Context) {
	ls.reqMu.Lock()
	reqs := ls.reqs
	ls.reqs = nil
	ls.reqMu.Unlock()
	defer func() {
		ls.pending.Add(-int32(len(reqs)))
		cue(ls.done)
	}()
	for _, r := range reqs {
		seq, epoch := ls.p.fence.held()
		if seq != 0 && (r.anyLease || r.epoch == epoch) {
			ls.stepDown(r.why)
			if r.release {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ls.p.cfg.LeaseTTL/2)
				if err := ls.p.plans.ReleaseLease(rctx, bus.LeaseName, seq); err != nil {
					ls.log.Warn().Err(err).Msg("cannot give the lease up; it lapses unrenewed")
				}
				cancel()
			}
		}
		if r.hold > 0 {
			ls.holdUntil = ls.p.clock.Now().Add(r.hold)
		}
		if r.look {
			next := r.next
			if ls.current() != 0 {
				next = min(next, ls.every())
			}
			ls.timer.Reset(next)
		}
	}
}

// tell tells the loop ev, replacing an event it has not read: what the
// lease is now is what counts.
func (ls *leaser) tell(ev leaseEvent) { replace(ls.events, ev) }

// replace sends v on ch (of one slot), replacing a value not yet read.
func replace[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// fence is the lease every publish is fenced by. seq is the lease
// message's stream sequence (0: none held); epoch counts the leases
// this planner took (taken, resumed, stepped down from; a renewal is
// the same lease), so that the loop, which leads on the epoch it caught
// up on (Service.led), never publishes on a lease it has not caught up
// on. The leaser's goroutine alone writes both (set), a renewal's seq
// only while holding mu, which a publish holds from reading the lease
// to the stream's answer, so that no renewal changes the lease in
// between. elected: the planner's loop runs, so a publish without the
// lease it leads on is refused (a Service driven without its loop, in
// tests, publishes unfenced). mu is outermost.
type fence struct {
	mu      chanMutex
	seq     atomic.Uint64
	epoch   atomic.Uint64
	elected atomic.Bool
}

// set makes the lease seq at epoch: the epoch first, so that a reader
// (held) that sees the new seq sees the new epoch too.
func (f *fence) set(seq, epoch uint64) {
	f.epoch.Store(epoch)
	f.seq.Store(seq)
}

// held is the lease held (seq 0: none) and its epoch; an epoch newer
// than seq's may be read while the lease changes, never an older one.
func (f *fence) held() (seq, epoch uint64) {
	seq = f.seq.Load()
	return seq, f.epoch.Load()
}

// chanMutex is a mutex whose Lock can give up (lockWithin).
type chanMutex struct{ ch chan struct{} }

func newChanMutex() chanMutex { return chanMutex{make(chan struct{}, 1)} }

func (m *chanMutex) Lock()   { m.ch <- struct{}{} }
func (m *chanMutex) Unlock() { <-m.ch }

// lockWithin locks m, waiting at most d by clock (or until ctx ends);
// false when it could not.
func (m *chanMutex) lockWithin(ctx context.Context, clock Clock, d time.Duration) bool {
	select {
	case m.ch <- struct{}{}:
		return true
	default:
	}
	deadline := clock.NewTimer(d)
	defer deadline.Stop()
	select {
	case m.ch <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-deadline.C():
		return false
	}
}

// run tends the lease until ctx ends, then gives it back.
func (ls *leaser) run(ctx context.Context) {
	defer ls.timer.Stop()
	for {
		select {
		case <-ctx.Done():
			ls.release(ctx)
			return
		case <-ls.asked:
			ls.requests(ctx)
		case <-ls.timer.C():
			next := ls.tend(ctx)
			if next <= 0 {
				next = ls.every()
			}
			ls.timer.Reset(next)
		}
	}
}

// every is how often a leader renews and a standby looks.
func (ls *leaser) every() time.Duration {
	if ls.current() != 0 {
		return ls.p.cfg.LeaseTTL / 3
	}
	return min(ls.p.cfg.LeaseTTL/5, 500*time.Millisecond)
}

func (ls *leaser) current() uint64 { return ls.p.fence.seq.Load() }

// tend renews the lease while this planner leads, and otherwise looks
// whether it is free and takes it; neither while the planner's loop is
// stuck (liveness.go), nor, after it stood down, before holdUntil. It
// returns how long until the next look (0: as usual, every).
func (ls *leaser) tend(ctx context.Context) time.Duration {
	if ls.isStuck() {
		return 0
	}
	if ls.current() != 0 {
		ls.renew(ctx)
		return 0
	}
	if hold := ls.p.until(ls.holdUntil); hold > 0 {
		return hold
	}
	rctx, cancel := context.WithTimeout(ctx, ls.p.cfg.StoreTimeout)
	defer cancel()
	cur, err := ls.p.plans.ReadLease(rctx, bus.LeaseName)
	if err != nil {
		ls.log.Debug().Err(err).Msg("cannot read the plan's lease")
		return 0
	}
	if cur != nil && cur.Holder == ls.p.plans.Publisher() {
		ls.resume(cur) // stood down while its lease stood: it leads still
		return 0
	}
	if cur != nil {
		ls.held(ctx, cur)
		return 0
	}
	ls.take(ctx, 0)
	return 0
}

// held looks at the lease another planner holds: one renewed since the
// last look is a live planner's, and this one stands by; one not
// renewed for a TTL lapsed (its holder is gone), and this one takes it
// over by that very message, which fails if the holder renewed after
// all. A lease this planner's own predecessor left behind (predecessor)
// is said to be one; it is taken over at once when that predecessor's
// process is known to be gone, else when it lapses.
func (ls *leaser) held(ctx context.Context, cur *bus.Lease) {
	first := cur.Holder != ls.holder
	if first {
		ls.holder, ls.said = cur.Holder, ""
	}
	host, _ := os.Hostname()
	own, gone := predecessor(cur, host, os.Getpid(), ls.p.marks.predecessor(), pidAlive, ls.p.clock.Now())
	if own && gone {
		if ls.said != "gone" {
			ls.said = "gone"
			ls.log.Info().Str("holder", cur.Holder).Str("holder_host", cur.Host).Int("holder_pid", cur.PID).
				Msg("the lease is held by this planner's predecessor on this host, whose process is gone (killed or crashed without giving it back): taking it over")
		}
		ls.take(ctx, cur.Seq)
		return
	}
	renewed := cur.Seq != ls.seen
	if renewed {
		ls.seen, ls.seenAt = cur.Seq, ls.p.clock.Now()
	}
	switch {
	case own && first:
		// Its lease lapses unless renewed, which a dead planner cannot do.
		ls.said = "predecessor"
		ls.log.Info().Str("holder", cur.Holder).Str("holder_host", cur.Host).Int("holder_pid", cur.PID).
			Str("lapses_in", dur(max(0, ls.p.until(cur.Expires())))).
			Msg("standing by: the lease is still held by this planner's predecessor (it stopped without giving it back); waiting for it to lapse")
	case !own && first || renewed && ls.said != "other":
		// Renewed: whoever holds it lives, whatever it looked like.
		ls.said = "other"
		ls.log.Info().Str("leader", cur.Holder).Str("leader_host", cur.Host).Int("leader_pid", cur.PID).Msg("standing by: another planner leads")
	}
	if renewed || ls.p.since(ls.seenAt) < ls.p.cfg.LeaseTTL {
		return
	}
	ls.take(ctx, cur.Seq)
}

// predecessor says whether cur, a lease another planner instance holds,
// is this planner's own predecessor's: the instance the state file
// named when this planner started (before), or a planner of this host
// (the same hostname) whose process is not running (alive says, for a
// pid of this host) or had this very pid (a container's planner is
// often pid 1: a holder of this host with this planner's pid ran before
// it). gone: its process is known to have ended, so that its lease may
// be taken over at once: this host, another pid, not running, and the
// lease not renewed for longer than its holder renews it (by this
// host's clock, the holder's too), lest a live planner of another
// machine that took this one's hostname lose its lease.
func predecessor(cur *bus.Lease, host string, pid int, before string, alive func(int) bool, now time.Time) (own, gone bool) {
	sameHost := cur.Host != "" && cur.Host == host
	dead := sameHost && cur.PID > 0 && cur.PID != pid && !alive(cur.PID)
	every := time.Duration(cur.TTLSeconds*float64(time.Second)) / 3
	gone = dead && now.Sub(cur.Renewed) > every+time.Second
	own = dead || before != "" && cur.Holder == before || sameHost && cur.PID == pid
	return own, gone
}

// isStuck says whether the planner's loop is stuck: a leader then
// renews no more, and stands down once its lease lapsed (a standby takes
// it over by then); a standby takes no lease. It logs the first look of
// each stretch, and tells the loop of its start and end, for its health.
func (ls *leaser) isStuck() bool {
	d, what, stuck := ls.p.pulse.stuck(ls.p.stall())
	if !stuck {
		if ls.stuckSaid {
			ls.stuckSaid = false
			replace(ls.stuck, "")
			ls.log.Info().Msg("the planner's loop makes progress again")
		}
		return false
	}
	why := stuckWhy(d, what)
	if !ls.stuckSaid {
		ls.stuckSaid = true
		replace(ls.stuck, why)
		if ls.current() != 0 {
			ls.log.Error().Str("stuck_for", dur(d)).Str("in", what).Msg("the planner's loop is stuck: not renewing the lease, so that a standby takes over when it lapses")
		} else {
			ls.log.Error().Str("stuck_for", dur(d)).Str("in", what).Msg("the planner's loop is stuck: taking no lease while it is")
		}
	}
	if ls.current() != 0 && ls.p.since(ls.renewed) >= ls.p.cfg.LeaseTTL {
		ls.stepDown(why + ": the lease lapsed unrenewed")
	}
	return true
}

// resume leads again on this planner's own lease, still the plan's: it
// stood down (a refused publish) while nobody took the lease.
func (ls *leaser) resume(cur *bus.Lease) {
	epoch := ls.p.fence.epoch.Load() + 1
	ls.p.fence.set(cur.Seq, epoch)
	ls.since, ls.renewed, ls.holder = cur.Since, ls.p.clock.Now(), ""
	ls.log.Info().Uint64("lease", cur.Seq).Msg("leading again: the lease was still this planner's")
	ls.tell(leaseEvent{seq: cur.Seq, epoch: epoch})
}

// body is this planner's lease body.
func (ls *leaser) body(since time.Time) *bus.Lease {
	host, _ := os.Hostname()
	return &bus.Lease{Holder: ls.p.plans.Publisher(), Host: host, PID: os.Getpid(), Since: since.UTC(),
		Renewed: ls.p.clock.Now().UTC(), TTLSeconds: ls.p.cfg.LeaseTTL.Seconds(), Problems: ls.p.leaseProblems()}
}

// leaseProblems are the problems the lease carries: the loop's, as its
// snapshot has them, but a stuck stretch: the lease is written only
// while the loop makes progress (tend), so one it records still is over.
func (p *Service) leaseProblems() []string {
	return sortedProblems(p.view().health.problems, stuckKey)
}

// write stores the lease expecting the subject at expect, so that no
// publish reads the lease while it changes: a renewal (expect not 0) is
// recorded before any publish may read the lease again.
func (ls *leaser) write(ctx context.Context, since time.Time, expect uint64) (uint64, error) {
	// A publish holds fence.mu for at most its deadline; one wedged past it
	// (a stuck loop) must not wedge the lease's goroutine too.
	if !ls.p.fence.mu.lockWithin(ctx, ls.p.clock, ls.p.cfg.LeaseTTL/2) {
		return 0, fmt.Errorf("write lease: a publish has held the lease lock for %s", ls.p.cfg.LeaseTTL/2)
	}
	defer ls.p.fence.mu.Unlock()
	// Well inside the TTL: a renewal that takes longer is as good as lost.
	ctx, cancel := context.WithTimeout(ctx, ls.p.cfg.LeaseTTL/2)
	defer cancel()
	seq, err := ls.p.plans.WriteLease(ctx, bus.LeaseName, ls.body(since), expect)
	switch {
	case err == nil && expect != 0:
		ls.set(expect, seq)
	case errors.Is(err, bus.ErrLeaseHeld) && expect != 0:
		// A renewal stored whose answer was lost leaves this planner's
		// lease at another sequence: take that one.
		if cur, rerr := ls.p.plans.ReadLease(ctx, bus.LeaseName); rerr == nil && cur != nil && cur.Holder == ls.p.plans.Publisher() {
			ls.set(expect, cur.Seq)
			return cur.Seq, nil
		}
	}
	return seq, err
}

// take takes the lease, free (expect 0) or lapsed (expect: the lease
// message no one renewed), and tells the loop, which reads every plan's
// latest revision before it leads (loop.leaseChanged).
func (ls *leaser) take(ctx context.Context, expect uint64) {
	now := ls.p.clock.Now()
	seq, err := ls.write(ctx, now, expect)
	if err != nil {
		if !errors.Is(err, bus.ErrLeaseHeld) {
			ls.log.Debug().Err(err).Msg("cannot take the plan's lease")
		}
		return
	}
	epoch := ls.p.fence.epoch.Load() + 1
	ls.p.fence.set(seq, epoch)
	ls.since, ls.renewed, ls.holder = now, now, ""
	ls.log.Info().Uint64("lease", seq).Msg("leading: this planner replans and publishes every plan")
	ls.tell(leaseEvent{seq: seq, epoch: epoch})
}

// renew renews the lease; when another planner holds it now, or it
// lapsed unrenewed, this planner stands by.
func (ls *leaser) renew(ctx context.Context) {
	seq0, since, renewed := ls.p.fence.seq.Load(), ls.since, ls.renewed
	_, err := ls.write(ctx, since, seq0)
	if err == nil || ctx.Err() != nil {
		return
	}
	if errors.Is(err, bus.ErrLeaseHeld) {
		ls.stepDown("the lease lapsed or another planner took it")
		return
	}
	if ls.p.since(renewed) >= ls.p.cfg.LeaseTTL {
		ls.stepDown(fmt.Sprintf("the lease lapsed unrenewed: %v", err))
		return
	}
	ls.log.Warn().Err(err).Msg("cannot renew the plan's lease; retrying")
}

// set records the renewal of the lease at was as seq (the same epoch),
// unless this planner stood down meanwhile.
func (ls *leaser) set(was, seq uint64) {
	if ls.p.fence.seq.Load() != was {
		return
	}
	ls.p.fence.seq.Store(seq)
	ls.renewed = ls.p.clock.Now()
}

// stepDown makes this planner a standby, and says so in the leader
// gauges at once: a loop that is stuck, and so reads no event, must not
// leave two planners leading in the metrics.
func (ls *leaser) stepDown(why string) {
	if ls.p.fence.seq.Load() == 0 {
		return
	}
	ls.log.Warn().Str("why", why).Msg("no longer leading; standing by")
	epoch := ls.p.fence.epoch.Load() + 1
	ls.p.fence.set(0, epoch)
	ls.holder = ""
	ls.p.notLeadingGauges()
	ls.tell(leaseEvent{epoch: epoch, why: why})
}

// release gives the lease up at a clean shutdown, so that a standby
// takes over at its next look instead of after the TTL.
func (ls *leaser) release(ctx context.Context) {
	seq := ls.current()
	if seq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := ls.p.plans.ReleaseLease(ctx, bus.LeaseName, seq); err != nil {
		ls.log.Warn().Err(err).Msg("cannot give the lease up; a standby takes over when it lapses")
	}
}

// cue signals ch without blocking: one pending cue is enough.
func cue(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// leading is the lease this planner holds (0: none), caught up on by
// the loop or not.
func (p *Service) leading() uint64 { return p.fence.seq.Load() }

// leads says whether this planner leads: it holds the lease, and the
// loop caught up on every plan's latest revision since it took that
// very lease (the same epoch). Safe from any goroutine.
func (p *Service) leads() bool {
	seq, epoch := p.fence.held()
	led := p.led.Load()
	return seq != 0 && led != 0 && led == epoch
}
