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
	if !l.p.cfg.NC.IsConnected() {
		return
	}
	reconnected := false
	if n := l.p.cfg.NC.Stats().Reconnects; n != l.reconnects {
		l.reconnects, reconnected = n, true
	}
	missing, err := l.p.missing(ctx)
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
	if reconnected || len(missing) > 0 {
		l.log.Info().Bool("reconnected", reconnected).Msg("re-reading the whole inventory and the spec")
		l.restartWatches(ctx)
	}
}

// stateStreams are the streams behind the planner's state.
var stateStreams = []string{bus.PlansStream, client.AssignmentsStream, bus.InventoryStream, "KV_" + bus.SpecBucket,
	"OBJ_" + client.PlansBucket}

// missing lists the streams of the planner's state that NATS no longer
// has.
func (p *Planner) missing(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, guardEvery)
	defer cancel()
	var out []string
	for _, name := range stateStreams {
		_, err := p.cfg.JS.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			out = append(out, name)
		case err != nil:
			return nil, err
		}
	}
	return out, nil
}

// recreate makes the missing streams again and puts back what this
// planner knows: the spec it plans on; for a lost plan stream, its
// latest plan becomes the next revision, published whole, and its
// lease is taken again; for lost assignments, every node's.
func (l *loop) recreate(ctx context.Context, missing []string) error {
	p := l.p
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
		case "KV_" + bus.SpecBucket:
			p.mu.Lock()
			spec := p.specBytes
			p.mu.Unlock()
			if spec != nil {
				if _, err := p.specs.Put(ctx, p.cfg.Plan, spec); err != nil {
					return fmt.Errorf("restore the spec: %w", err)
				}
			}
		case bus.PlansStream:
			p.mu.Lock()
			if p.latest != nil {
				orphan := *p.latest
				orphan.Orphan = true
				p.latest = &orphan
			}
			p.reconcile = p.latest != nil
			p.mu.Unlock()
			l.stepDown("the plan stream, and the lease with it, was lost")
			l.lease.timer.Reset(0)
			l.kick()
		case client.AssignmentsStream, "OBJ_" + client.PlansBucket:
			p.mu.Lock()
			p.reconcile = p.latest != nil
			p.mu.Unlock()
			l.armCheck(0)
		}
	}
	return nil
}

// restartWatches re-reads the inventory (a full resync, reconciled
// against what the planner held) and the spec.
func (l *loop) restartWatches(ctx context.Context) {
	if l.stopWatch != nil {
		l.stopWatch()
	}
	l.events, l.synced = nil, false
	l.watch(ctx)
	if l.follow == nil {
		if f, err := l.p.followPlans(ctx); err == nil {
			l.follow = f
		}
	}
	if kv, err := l.p.specs.KV(ctx); err == nil {
		if w, err := kv.Watch(ctx, l.p.cfg.Plan); err == nil {
			_ = l.specW.Stop()
			l.specW = w
		}
	}
}

// outage notices most of the latest plan's nodes gone at once: rather
// than nodes leaving, that is an inventory outage (NATS away for longer
// than the keys' TTL, the inventory bucket lost), after which reporters
// put their keys again. The planner then settles as after a restart:
// it waits for those nodes to report, up to Settle, and the revision
// says so. It returns whether it started settling.
func (l *loop) outage() bool {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.settlingOutage || p.latest == nil || !p.latest.Plan.Valid || p.cfg.Settle < 0 {
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
		if _, ok := p.live.docs[id]; !ok {
			lost++
		}
	}
	if len(nodes) < 2 || lost*2 <= len(nodes) {
		return false
	}
	l.settlingOutage, l.started = true, time.Now()
	p.inherited, p.reported = p.latest.Plan, map[string]bool{}
	for id := range p.live.docs {
		p.reported[id] = true
	}
	p.note = fmt.Sprintf("%d of %d nodes vanished at once (an inventory outage, not nodes leaving): waited up to %s for them to report again", lost, len(nodes), p.cfg.Settle)
	l.log.Warn().Int("lost", lost).Int("nodes", len(nodes)).Dur("settle", p.cfg.Settle).
		Msg("most of the plan's nodes vanished at once: treating it as an inventory outage, waiting for them to report again")
	return true
}
