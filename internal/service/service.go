// Package service is the event-driven planner: it watches the inventory
// bucket and the plan's spec, replans moving as little as possible,
// publishes each changed plan as the next revision, and answers the
// poolplanner micro service.
package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// DefaultDebounce coalesces a burst of inventory changes (a rack
// rebooting) into one replan.
const DefaultDebounce = 200 * time.Millisecond

// DefaultSettle covers a reporter's default TTL (3 heartbeats of 5 s):
// by then every live node has reported again.
const DefaultSettle = 15 * time.Second

// maxConflicts bounds how often one replan re-reads and recomputes after
// another planner published first.
const maxConflicts = 8

// Config is what a Planner needs.
type Config struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// Plan names the plan (default "default").
	Plan string
	// Spec, when set, is stored as the plan's spec at start if it differs
	// from the stored one.
	Spec []byte
	// Debounce is how long the inventory must stay quiet before a
	// replan; zero replans at once.
	Debounce time.Duration
	// Settle is how long after start the planner waits for the nodes of
	// the latest valid plan to report before replanning without them
	// (DefaultSettle when zero; negative: no wait).
	Settle time.Duration
	// NoService skips registering the micro service.
	NoService bool
	Log       zerolog.Logger
	// Now is the clock for created_at; nil means time.Now.
	Now func() time.Time
}

// Planner is one planner service instance. Several may run on one plan:
// the stream's expected-sequence check keeps the history linear.
type Planner struct {
	cfg   Config
	plans *bus.PlanStore
	specs *bus.SpecStore
	inv   *bus.InventoryStore

	mu sync.Mutex
	// nodes is the live inventory by node id.
	nodes map[string]inventory.NodeInventory
	// latest is the newest stored version of the plan.
	latest *bus.StoredPlan
	spec   *planner.Spec
	digest string
	// basis is the inventory the latest plan this planner published was
	// made from, to say what changed.
	basis map[string]inventory.NodeInventory
}

// New returns a planner; Run starts it.
func New(cfg Config) *Planner {
	if cfg.Plan == "" {
		cfg.Plan = "default"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	plans := bus.NewPlanStore(cfg.JS)
	plans.Publisher = nuid.Next()
	return &Planner{
		cfg:   cfg,
		plans: plans,
		specs: bus.NewSpecStore(cfg.JS),
		inv:   bus.NewInventoryStore(cfg.JS),
		nodes: map[string]inventory.NodeInventory{},
	}
}

// SpecDigest is the digest a plan message carries of its spec.
// It digests the parsed spec, not its bytes, so that a comment or
// whitespace edit is no spec change (which would replan from scratch).
func SpecDigest(spec *planner.Spec) string {
	b, _ := json.Marshal(spec) // plain data: cannot fail; map keys sorted
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Run plans until ctx is done. It returns an error only for what waiting
// cannot mend (a bad plan name or spec); JetStream not answering at start,
// and outages later, are logged and ridden out.
func (p *Planner) Run(ctx context.Context) error {
	log := p.cfg.Log.With().Str("plan", p.cfg.Plan).Logger()
	if err := bus.ValidatePlanName(p.cfg.Plan); err != nil {
		return err
	}
	if len(p.cfg.Spec) > 0 {
		if _, err := planner.ParseSpec(p.cfg.Spec); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
	}
	// NATS may not be up yet (a compose file starting everything at once):
	// keep trying, saying so, rather than give up.
	var latest *bus.StoredPlan
	for attempt := 0; ; attempt++ {
		var err error
		if latest, err = p.start(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := bus.Backoff(attempt)
		log.Warn().Err(err).Dur("retry_in", wait).Msg("cannot reach JetStream yet; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	p.mu.Lock()
	p.latest = latest
	p.mu.Unlock()
	if !p.cfg.NoService {
		svc, err := bus.AddService(p.cfg.NC, p)
		if err != nil {
			return err
		}
		defer func() { _ = svc.Stop() }()
	}
	follow, err := p.plans.FollowUnknown(ctx, p.cfg.Plan, func(seq uint64, h nats.Header) bool {
		if h.Get(bus.PlannerHeader) == p.plans.Publisher {
			return true // ours: replan stored it as latest already
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.latest != nil && seq <= p.latest.Seq
	})
	if err != nil {
		return err
	}
	specKV, err := p.specs.KV(ctx)
	if err != nil {
		return err
	}
	specW, err := specKV.Watch(ctx, p.cfg.Plan)
	if err != nil {
		return fmt.Errorf("watch spec %s: %w", p.cfg.Plan, err)
	}
	defer func() { _ = specW.Stop() }()

	var (
		events  <-chan bus.Event
		synced  bool
		resync  map[string]inventory.NodeInventory // during a re-established watch
		dirty   bool
		timer   = time.NewTimer(time.Hour)
		retry   = time.NewTimer(0)
		attempt int
	)
	timer.Stop()
	defer timer.Stop()
	defer retry.Stop()
	// A steady stream of changes (a rolling start of thousands of
	// reporters, a flapping GPU) must not postpone the replan for ever:
	// it waits for a quiet Debounce, but at most maxWait since the first
	// change.
	var dirtySince time.Time
	maxWait := max(10*p.cfg.Debounce, time.Second)
	kick := func() {
		if !dirty {
			dirtySince = time.Now()
		}
		dirty = true
		if synced && p.spec != nil {
			timer.Reset(max(0, min(p.cfg.Debounce, maxWait-time.Since(dirtySince))))
		}
	}
	started := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			ch, err := p.inv.Watch(ctx)
			if err != nil {
				log.Warn().Err(err).Msg("inventory watch failed; retrying")
				retry.Reset(bus.Backoff(attempt))
				attempt++
				continue
			}
			events, resync = ch, map[string]inventory.NodeInventory{}
		case ev, ok := <-events:
			if !ok {
				// The watch ended without us asking: start over with a full
				// resync, so nothing that happened meanwhile is missed.
				events, synced = nil, false
				if ctx.Err() == nil {
					log.Warn().Msg("inventory watch closed; re-establishing")
					retry.Reset(bus.Backoff(attempt))
					attempt++
				}
				continue
			}
			attempt = 0
			if resync != nil {
				switch ev.Op {
				case bus.Changed, bus.Heartbeat:
					if ev.Op == bus.Changed {
						resync[ev.NodeID] = ev.Inventory
					} else if _, seen := resync[ev.NodeID]; !seen {
						// A heartbeat of a key this watch has not shown:
						// what we knew is all there is. Never overwrite the
						// fresher value this watch delivered.
						if old, ok := p.node(ev.NodeID); ok {
							resync[ev.NodeID] = old
						}
					}
				case bus.Removed:
					delete(resync, ev.NodeID)
				case bus.Synced:
					if p.replaceNodes(resync) {
						dirty = true
					}
					resync, synced = nil, true
					kick()
				}
				continue
			}
			if p.apply(ev) {
				kick()
			}
		case sp, ok := <-follow:
			if !ok {
				follow = nil
				continue
			}
			p.mu.Lock()
			if p.latest == nil || sp.Seq > p.latest.Seq {
				p.latest = sp
			}
			p.mu.Unlock()
		case e, ok := <-specW.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				continue // the initial values are in
			}
			if e.Operation() != jetstream.KeyValuePut {
				log.Warn().Msg("spec deleted; keeping the last one")
				continue
			}
			spec, err := planner.ParseSpec(e.Value())
			if err != nil {
				log.Error().Err(err).Uint64("spec_revision", e.Revision()).Msg("stored spec does not parse; keeping the last one")
				continue
			}
			p.mu.Lock()
			p.spec, p.digest = spec, SpecDigest(spec)
			p.mu.Unlock()
			log.Info().Uint64("spec_revision", e.Revision()).Msg("spec loaded")
			kick()
		case <-timer.C:
			if !dirty {
				continue
			}
			if wait := p.settling(started); wait > 0 {
				timer.Reset(wait)
				continue
			}
			dirty = false
			if err := p.replan(ctx); err != nil {
				log.Error().Err(err).Msg("replan failed; retrying")
				dirty = true
				timer.Reset(max(p.cfg.Debounce, time.Second))
			}
		}
	}
}

// settling is how much longer a freshly started planner waits before
// replanning away from a valid plan whose nodes have not all reported yet.
// After a restart of the planner and its embedded server the inventory
// fills up as reporters reconnect; planning on the first, partial view
// would move every worker and publish plans no one can run.
func (p *Planner) settling(started time.Time) time.Duration {
	left := p.cfg.Settle - time.Since(started)
	if left <= 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest == nil || !p.latest.Plan.Valid {
		return 0
	}
	for _, pl := range p.latest.Plan.Pools {
		for _, n := range pl.Nodes {
			if _, ok := p.nodes[n.NodeID]; !ok {
				return left
			}
		}
	}
	return 0
}

// start makes sure the plan stream exists, stores the configured spec if
// it differs from the stored one, and reads the latest plan.
func (p *Planner) start(ctx context.Context) (*bus.StoredPlan, error) {
	if err := p.plans.Ensure(ctx); err != nil {
		return nil, err
	}
	if len(p.cfg.Spec) > 0 {
		cur, _, err := p.specs.Get(ctx, p.cfg.Plan)
		if err != nil && !errors.Is(err, bus.ErrNotFound) {
			return nil, err
		}
		if string(cur) != string(p.cfg.Spec) {
			if _, err := p.specs.Put(ctx, p.cfg.Plan, p.cfg.Spec); err != nil {
				return nil, err
			}
		}
	}
	return p.plans.Latest(ctx, p.cfg.Plan)
}

func (p *Planner) node(id string) (inventory.NodeInventory, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.nodes[id]
	return n, ok
}

// apply folds one inventory event into the live inventory and reports
// whether it changed anything a plan could depend on.
func (p *Planner) apply(ev bus.Event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Op {
	case bus.Changed:
		if old, ok := p.nodes[ev.NodeID]; ok && inventory.SameInventory(old, ev.Inventory) {
			return false
		}
		p.nodes[ev.NodeID] = ev.Inventory
		return true
	case bus.Removed:
		if _, ok := p.nodes[ev.NodeID]; !ok {
			return false
		}
		delete(p.nodes, ev.NodeID)
		return true
	case bus.Synced:
		return true
	}
	return false // heartbeats change nothing
}

// replaceNodes swaps in a resynced inventory and reports whether it
// differs.
func (p *Planner) replaceNodes(nodes map[string]inventory.NodeInventory) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := len(nodes) != len(p.nodes)
	for id, n := range nodes {
		if old, ok := p.nodes[id]; !ok || !inventory.SameInventory(old, n) {
			changed = true
		}
	}
	p.nodes = nodes
	return changed
}

// snapshot returns the planner nodes of the live inventory, by id.
func (p *Planner) snapshot() ([]planner.Node, map[string]inventory.NodeInventory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.nodes))
	for id := range p.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	nodes := make([]planner.Node, 0, len(ids))
	copyOf := make(map[string]inventory.NodeInventory, len(ids))
	for _, id := range ids {
		inv := p.nodes[id]
		copyOf[id] = inv
		n, err := inv.PlannerNode()
		if err != nil {
			p.cfg.Log.Warn().Err(err).Str("node", id).Msg("skipping a node whose inventory is malformed")
			continue
		}
		nodes = append(nodes, n)
	}
	return nodes, copyOf
}

// replan computes the next plan and publishes it if it changed. On a
// conflict it re-reads the latest and recomputes.
func (p *Planner) replan(ctx context.Context) error {
	nodes, invs := p.snapshot()
	for attempt := 0; ; attempt++ {
		p.mu.Lock()
		latest, spec, digest, basis := p.latest, p.spec, p.digest, p.basis
		p.mu.Unlock()
		var prev *planner.Plan
		var expect uint64
		if latest != nil {
			prev, expect = latest.Plan, latest.Seq
		}
		specChanged := latest != nil && latest.SpecDigest != digest
		// A new spec is planned incrementally too: workers whose needs it
		// did not change keep their place.
		next, ch, _ := planner.Replan(prev, spec, nodes)
		if prev != nil && planner.SamePlacement(prev, next) {
			if specChanged {
				// The new spec plans as the old one did: adopt it, so the
				// next inventory change replans sticky again.
				p.mu.Lock()
				if p.latest == latest {
					p.latest = &bus.StoredPlan{Plan: latest.Plan, Seq: latest.Seq, SpecDigest: digest}
				}
				p.mu.Unlock()
			}
			return nil
		}
		next.Name = p.cfg.Plan
		next.Revision = 1
		if prev != nil {
			next.Revision = prev.Revision + 1
		}
		next.CreatedAt = p.cfg.Now().UTC()
		next.Reason = reason(prev, basis, invs, specChanged, ch)
		seq, err := p.plans.Publish(ctx, next, digest, expect)
		if errors.Is(err, bus.ErrConflict) && attempt < maxConflicts {
			sp, rerr := p.plans.Latest(ctx, p.cfg.Plan)
			if rerr != nil {
				return rerr
			}
			p.mu.Lock()
			p.latest = sp
			p.mu.Unlock()
			continue
		}
		if err != nil {
			return err
		}
		p.mu.Lock()
		if p.latest == nil || seq > p.latest.Seq {
			p.latest = &bus.StoredPlan{Plan: next, Seq: seq, SpecDigest: digest}
		}
		p.basis = invs
		p.mu.Unlock()
		p.cfg.Log.Info().Str("plan", next.Name).Int("revision", next.Revision).Bool("valid", next.Valid).
			Int("moved", next.Moved).Str("reason", next.Reason).Msg("plan published")
		return nil
	}
}

// reason says why a new revision exists: which nodes came or went, which
// GPUs turned unhealthy, a spec change, and what the planner did.
func reason(prev *planner.Plan, basis, now map[string]inventory.NodeInventory, specChanged bool, ch *planner.Change) string {
	var parts []string
	if prev == nil {
		parts = append(parts, "first plan")
	}
	if specChanged {
		parts = append(parts, "spec changed")
	}
	rebuilt := basis == nil && prev != nil
	if rebuilt {
		// A restarted planner does not know the inventory the last plan
		// saw; the plan's own nodes tell which left.
		basis = map[string]inventory.NodeInventory{}
		for _, pl := range prev.Pools {
			for _, n := range pl.Nodes {
				if inv, ok := now[n.NodeID]; ok {
					basis[n.NodeID] = inv
				} else {
					basis[n.NodeID] = inventory.NodeInventory{NodeID: n.NodeID}
				}
			}
		}
	}
	if prev != nil {
		var joined, left, sick, changed []string
		for id, n := range now {
			old, ok := basis[id]
			switch {
			case !ok:
				// A restarted planner knows only the plan's nodes, so an
				// idle node it now sees may not have joined at all.
				if !rebuilt {
					joined = append(joined, id)
				}
			case inventory.SameInventory(old, n):
			default:
				was := map[string]bool{}
				for _, g := range old.GPUs {
					was[g.UUID] = g.Healthy
				}
				any := false
				for _, g := range n.GPUs {
					if !g.Healthy && was[g.UUID] {
						sick = append(sick, fmt.Sprintf("%s:%d", id, g.Index))
						any = true
					}
				}
				if !any {
					changed = append(changed, id)
				}
			}
		}
		for id := range basis {
			if _, ok := now[id]; !ok {
				left = append(left, id)
			}
		}
		for _, l := range []struct {
			what string
			ids  []string
		}{{"nodes joined", joined}, {"nodes left", left}, {"GPUs unhealthy", sick}, {"nodes changed", changed}} {
			if len(l.ids) > 0 {
				sort.Strings(l.ids)
				parts = append(parts, l.what+": "+ellipsis(l.ids, 8))
			}
		}
	}
	if s := ch.Summary(); s != "" && !(ch.Fresh && (ch.FreshWhy == "first plan" || ch.FreshWhy == "spec changed")) {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		parts = append(parts, "inventory changed")
	}
	return strings.Join(parts, "; ")
}

func ellipsis(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:n], ", ") + fmt.Sprintf(" and %d more", len(ids)-n)
}

// Validate implements bus.Answerer: spec planned on the live inventory,
// nothing published.
func (p *Planner) Validate(_ context.Context, data []byte) (*bus.ValidateReply, error) {
	spec, err := planner.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %w", bus.ErrBadRequest, err)
	}
	nodes, _ := p.snapshot()
	doc, _ := planner.Compute(spec, nodes)
	doc.Name = p.cfg.Plan
	doc.CreatedAt = p.cfg.Now().UTC()
	doc.Reason = "validation: not published"
	return &bus.ValidateReply{Plan: doc, Nodes: len(nodes)}, nil
}

// Plan implements bus.Answerer: the latest version from memory, other
// plans and older revisions from the stream.
func (p *Planner) Plan(ctx context.Context, req bus.PlanRequest) (*planner.Plan, error) {
	name := req.Plan
	if name == "" {
		name = p.cfg.Plan
	}
	if err := bus.ValidatePlanName(name); err != nil {
		return nil, err
	}
	if req.Revision < 0 {
		return nil, fmt.Errorf("%w: revision %d: must be >= 1", bus.ErrBadRequest, req.Revision)
	}
	var sp *bus.StoredPlan
	p.mu.Lock()
	if name == p.cfg.Plan && p.latest != nil && (req.Revision == 0 || req.Revision == p.latest.Plan.Revision) {
		sp = p.latest
	}
	p.mu.Unlock()
	var err error
	switch {
	case sp != nil:
	case req.Revision == 0:
		sp, err = p.plans.Latest(ctx, name)
		if err == nil && sp == nil {
			err = fmt.Errorf("plan %s: %w (no version published yet)", name, bus.ErrNotFound)
		}
	default:
		sp, err = p.plans.Revision(ctx, name, req.Revision)
	}
	if err != nil {
		return nil, err
	}
	return sp.Plan, nil
}
