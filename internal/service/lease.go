package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// DefaultLeaseTTL is how long a leading planner's lease lasts unrenewed:
// a standby takes over this long (and a poll) after the leader dies. It
// renews every third of it, so a leader rides out a NATS hiccup of two
// renewals.
const DefaultLeaseTTL = 5 * time.Second

// lease is the planner's side of the plan's lease: whether it leads, and
// since when. Only the loop goroutine changes it; Planner.leaseSeq,
// which publishNext reads, mirrors seq.
type lease struct {
	seq uint64
	// since is when this planner took the lease; renewed, when the
	// stream last confirmed it (this host's clock).
	since, renewed time.Time
	// holder is the last other holder seen, so a change is logged once.
	holder string
	timer  *time.Timer
}

// leaseEvery is how often a leader renews and a standby looks.
func (l *loop) leaseEvery() time.Duration {
	if l.lease.seq != 0 {
		return l.p.cfg.LeaseTTL / 3
	}
	return min(l.p.cfg.LeaseTTL/5, 500*time.Millisecond)
}

// tendLease renews the lease while this planner leads, and otherwise
// looks whether it is free and takes it. It returns true when this
// planner just took the lease.
func (l *loop) tendLease(ctx context.Context) bool {
	defer func() { l.lease.timer.Reset(l.leaseEvery()) }()
	if l.lease.seq != 0 {
		l.renewLease(ctx)
		return false
	}
	cur, err := l.p.plans.ReadLease(ctx, l.p.cfg.Plan)
	if err != nil {
		l.log.Debug().Err(err).Msg("cannot read the plan's lease")
		return false
	}
	if cur != nil {
		if cur.Holder != l.lease.holder {
			l.lease.holder = cur.Holder
			l.log.Info().Str("leader", cur.Holder).Str("leader_host", cur.Host).Msg("standing by: another planner leads this plan")
		}
		return false
	}
	return l.takeLease(ctx)
}

// newLease is this planner's lease body.
func (l *loop) newLease(since time.Time) *bus.Lease {
	host, _ := os.Hostname()
	return &bus.Lease{Holder: l.p.plans.Publisher, Host: host, PID: os.Getpid(), Since: since.UTC(),
		Renewed: time.Now().UTC(), TTLSeconds: l.p.cfg.LeaseTTL.Seconds()}
}

// takeLease takes the free lease, then reads the latest revision as the
// stream's leader has it, so that this planner continues the sequence
// from the last revision whoever led before published.
func (l *loop) takeLease(ctx context.Context) bool {
	now := time.Now()
	seq, err := l.p.plans.WriteLease(ctx, l.p.cfg.Plan, l.newLease(now), 0)
	if err != nil {
		if !errors.Is(err, bus.ErrLeaseHeld) {
			l.log.Debug().Err(err).Msg("cannot take the plan's lease")
		}
		return false
	}
	if err := l.catchUp(ctx); err != nil {
		// Leading on a stale latest would fork the history (the message
		// id check aside): give the lease back and try again.
		l.log.Warn().Err(err).Msg("took the lease but cannot read the latest revision; giving it back")
		_ = l.p.plans.ReleaseLease(context.WithoutCancel(ctx), l.p.cfg.Plan, seq)
		return false
	}
	l.lease.seq, l.lease.since, l.lease.renewed, l.lease.holder = seq, now, now, ""
	// Failures as a standby (a replan refused for the lease) are no
	// leader's: start afresh, so that kick arms the replan.
	l.failures, l.lastFailure = 0, ""
	l.p.mu.Lock()
	l.p.leaseSeq = seq
	// Whoever led may have died between a revision and its assignments.
	l.p.reconcile = l.p.latest != nil
	l.p.mu.Unlock()
	l.log.Info().Uint64("lease", seq).Msg("leading this plan: this planner replans and publishes")
	return true
}

// catchUp makes the latest revision the one the stream's leader has last
// (a direct get may be answered by a replica that lags).
func (l *loop) catchUp(ctx context.Context) error {
	last, err := l.p.plans.LastSeq(ctx, bus.PlanVersionSubject(l.p.cfg.Plan))
	if err != nil || last == 0 {
		return err
	}
	for attempt := 0; ; attempt++ {
		sp, err := l.p.plans.Latest(ctx, l.p.cfg.Plan)
		if err != nil {
			return err
		}
		if sp != nil && sp.Seq >= last {
			l.p.adopted(sp)
			return nil
		}
		if attempt >= 20 {
			return fmt.Errorf("revision at stream sequence %d not readable yet", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// renewLease renews the lease; when another planner holds it now, or it
// lapsed unrenewed, this planner stands by.
func (l *loop) renewLease(ctx context.Context) {
	seq, err := l.p.plans.WriteLease(ctx, l.p.cfg.Plan, l.newLease(l.lease.since), l.lease.seq)
	if err == nil {
		l.setLease(seq)
		return
	}
	if errors.Is(err, bus.ErrLeaseHeld) {
		cur, rerr := l.p.plans.ReadLease(ctx, l.p.cfg.Plan)
		if rerr == nil && cur != nil && cur.Holder == l.p.plans.Publisher {
			l.setLease(cur.Seq) // a renewal stored whose answer was lost
			return
		}
		l.stepDown("the lease lapsed or another planner took it")
		return
	}
	if time.Since(l.lease.renewed) >= l.p.cfg.LeaseTTL {
		l.stepDown(fmt.Sprintf("the lease lapsed unrenewed: %v", err))
		return
	}
	l.log.Warn().Err(err).Msg("cannot renew the plan's lease; retrying")
}

func (l *loop) setLease(seq uint64) {
	l.lease.seq, l.lease.renewed = seq, time.Now()
	l.p.mu.Lock()
	l.p.leaseSeq = seq
	l.p.mu.Unlock()
}

// stepDown makes this planner a standby.
func (l *loop) stepDown(why string) {
	if l.lease.seq == 0 {
		return
	}
	l.log.Warn().Str("why", why).Msg("no longer leading this plan; standing by")
	l.lease.seq, l.lease.holder = 0, ""
	// A settle for an outage is the next leader's to judge.
	l.settlingOutage = false
	l.p.mu.Lock()
	l.p.leaseSeq, l.p.note = 0, ""
	l.p.mu.Unlock()
}

// releaseLease gives the lease up at a clean shutdown, so that a
// standby takes over at its next look instead of after the TTL.
func (l *loop) releaseLease(ctx context.Context) {
	if l.lease.seq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := l.p.plans.ReleaseLease(ctx, l.p.cfg.Plan, l.lease.seq); err != nil {
		l.log.Warn().Err(err).Msg("cannot give the lease up; a standby takes over when it lapses")
	}
}

// leading says whether this planner holds the plan's lease.
func (p *Planner) leading() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaseSeq
}
