// Package service is the event-driven planner: it watches the inventory
// bucket and the plan's spec, replans moving as little as possible,
// publishes each changed plan as the next revision (an event, each
// node's assignment that changed, snapshots now and then), and answers
// the poolplanner micro service.
package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/api"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// DefaultDebounce coalesces a burst of inventory changes (a rack
// rebooting) into one replan.
const DefaultDebounce = 200 * time.Millisecond

// DefaultSettle covers a reporter's default TTL (3 heartbeats of 5 s):
// by then every live node has reported again.
const DefaultSettle = 15 * time.Second

// History limits: how old, and how many bytes of, the plan stream the
// planner keeps (Retain).
const (
	DefaultHistoryAge   = 30 * 24 * time.Hour
	DefaultHistoryBytes = 1 << 30
)

// DefaultSnapshotEvery is how many revisions a chain of changes runs at
// most before the planner stores a revision whole: rebuilding any
// revision reads at most that many events besides its base. (A chain
// also ends when its events outweigh its base.) At 20,000 nodes a
// snapshot is about 6 MB and a node leaving about 10 KB of events, so a
// revision costs about 35 KB on average, snapshots included.
const DefaultSnapshotEvery = 256

// DefaultInlineWorkers bounds the plans whose events carry the whole
// document: about 200 bytes a worker, well under a message even before
// gzip; such an event reads as the plan document itself.
const DefaultInlineWorkers = 2048

// maxConflicts bounds how often one replan re-reads and recomputes after
// another planner published first.
const maxConflicts = 8

// Config is what a Service needs.
type Config struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// Plan names the plan (default "default").
	Plan string
	// Spec, when set, is stored as the plan's spec at start if the plan
	// has none (or, with ReplaceSpec, if it differs from the stored one).
	Spec        []byte
	ReplaceSpec bool
	// SpecSeeded, when set, is told at start (again at each try, should
	// reading the plan after it fail) what became of Spec beside the
	// plan's stored spec: serve says it on stderr, as a stored spec kept
	// over a differing file is easy to miss in a log.
	SpecSeeded func(SpecSeed)
	// Debounce is how long the inventory must stay quiet before a
	// replan; zero replans at once.
	Debounce time.Duration
	// Settle is how long after start the planner waits for the nodes of
	// the plan it found at start to report before replanning without them
	// (DefaultSettle when zero; negative: no wait).
	Settle time.Duration
	// HistoryAge and HistoryBytes bound the plan stream (defaults when
	// zero; negative: no bound).
	HistoryAge   time.Duration
	HistoryBytes int64
	// SnapshotEvery bounds a chain of changes (DefaultSnapshotEvery when
	// zero).
	SnapshotEvery int
	// InlineWorkers bounds the plans whose events carry them whole
	// (DefaultInlineWorkers when zero; negative: none).
	InlineWorkers int
	// Replicas is how many servers of the NATS cluster keep each stream
	// and bucket (0: one); more than there are is an error at start.
	Replicas int
	// LeaseTTL is how long the leading planner's lease lasts unrenewed
	// (DefaultLeaseTTL when zero).
	LeaseTTL time.Duration
	// StoreTimeout bounds each call of the loop to JetStream
	// (DefaultStoreTimeout when zero); calls that move many messages get
	// more in proportion. StallAfter is how long the loop may go without
	// progress outside such a call before the planner stops renewing its
	// lease (LeaseTTL/2 when zero): a stuck leader loses the lease to a
	// standby.
	StoreTimeout time.Duration
	StallAfter   time.Duration
	// StandDownAfter is how many replans in a row may fail (writes
	// refused, timing out) before a leading planner gives its lease up,
	// says why, and leaves leading to another planner for
	// StandDownBackoff (doubling, at most maxStandDown, at each stand-down
	// in a row); DefaultStandDownAfter and DefaultStandDownBackoff when
	// zero.
	StandDownAfter   int
	StandDownBackoff time.Duration
	// StateFile, when set, is a local file (outside the JetStream store)
	// where the planner keeps each plan's highest revision published or
	// seen: a plan whose history was lost (a store wiped, a stream
	// deleted) goes on above it rather than numbering from 1 again;
	// and, beside it, each plan's latest revision, which such a plan
	// resumes on (placements.go).
	StateFile string
	// Probation is how long a GPU that recovered (unhealthy, then
	// healthy again) stays out before it gets work (DefaultProbation
	// when zero; negative: none).
	Probation time.Duration
	// Metrics records plans, replans, the inventory and requests (nil:
	// none).
	Metrics *metrics.Planner
	// NoService skips registering the micro service.
	NoService bool
	Log       zerolog.Logger
	// Now is the clock for created_at; nil means Clock's.
	Now func() time.Time
	// Clock is the time the loop and the leaser go by (nil: the
	// system's); tests may pass one they move by hand.
	Clock Clock
	// GrowAfter is how long a GPU must have been free before an elastic
	// group (worker_num {min, max}) grows onto it (DefaultGrowAfter when
	// zero; negative: at once): a GPU a plan just gave up goes to whoever
	// needs it first, not back to the elastic plan that held it.
	GrowAfter time.Duration
	// guardRound, in tests, replaces guardEvery as the time between the
	// loop's guard rounds: a test that waits for what a round does (a
	// problem said, a gauge set, a lost bucket restored) waits less.
	guardRound time.Duration
	// storeHook, in tests, is called at the start of each bounded store
	// call of the loop (Service.op), with its context: a hook that blocks
	// is a store that hangs.
	storeHook func(ctx context.Context, what string)
}

// Service is one planner service instance. Several may run on one
// cluster: the one holding the lease replans and publishes every plan,
// the others stand by, following its revisions and the inventory, and
// answer requests; the stream refuses a revision whose planner lost the
// lease.
//
// Who writes what: the loop's goroutine (loop.go) alone holds its state
// (loopState: the plans' states, the inventory view, the drains, its
// health) and takes no lock to use it; a Service holds none of it, so
// no request handler can reach it. The request handlers, the GPU map and
// the plans' follow goroutines read the snapshot the loop publishes
// (snap), health included. The leaser's goroutine (lease.go) owns the
// lease: its timing, its state and the fence's sequence and epoch,
// which it alone writes; it tells the loop what became of the lease
// (events) and of the loop's progress (stuck), and the loop asks it to
// step down, give the lease back or stand down (requests), never
// writing the leaser's state itself. The drain watch's goroutine sends
// the loop the drains and its problems. The loop alone writes led, the
// lease it leads on, and quiet. Locks, outermost first: fence.mu,
// leader.mu; the leaser's reqMu, the pulse's, the marks' and the
// tombstones' are innermost.
type Service struct {
	cfg Config
	// plans, specs, inv and drains are the stores (stores.go); plans
	// is nil without JetStream (a test driving the Service).
	plans  planStore
	specs  specStore
	inv    inventoryStore
	drains drainStore
	// ownerStore is the GPU UUID owners bucket (owners.go).
	ownerStore ownerStore
	// link is the connection and the streams themselves (stores.go).
	link link

	// snap is the loop's state as others read it.
	snap atomic.Pointer[snapshot]
	// fence is the lease every publish is fenced by; led, the lease
	// epoch (fence) the loop leads on, caught up on every plan's latest
	// revision since it was taken (0: it stands by): the loop's
	// goroutine alone writes it.
	fence fence
	led   atomic.Uint64
	// quiet says when the loop is idle with nothing pending, for Idle.
	quiet quiet
	// ready, made by Run before the service answers, is closed (once,
	// readyOnce) when the loop first publishes a snapshot past syncing:
	// the inventory and the specs read. A validation asked before then
	// waits for it, rather than plan on no nodes (spec set right after
	// serve). nil without Run (a test driving the Service): no wait.
	ready     chan struct{}
	readyOnce sync.Once

	// pulse is the loop's heartbeat (liveness.go), which the leaser and
	// Health read.
	pulse *pulse
	// marks are the plans' revision high-water marks (revisions.go).
	marks *marks
	// leader keeps the leader gauges (gauges.go).
	leader leaderGauge
	// clock is cfg.Clock.
	clock Clock
}

// New returns a planner service; Run starts it.
func New(cfg Config) *Service {
	if cfg.Plan == "" {
		cfg.Plan = "default"
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Now == nil {
		cfg.Now = cfg.Clock.Now
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.GrowAfter == 0 {
		cfg.GrowAfter = DefaultGrowAfter
	}
	if cfg.HistoryAge == 0 {
		cfg.HistoryAge = DefaultHistoryAge
	}
	if cfg.HistoryBytes == 0 {
		cfg.HistoryBytes = DefaultHistoryBytes
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	// NATS counts message TTLs in whole seconds.
	cfg.LeaseTTL = (cfg.LeaseTTL + time.Second - 1).Truncate(time.Second)
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = DefaultSnapshotEvery
	}
	if cfg.InlineWorkers == 0 {
		cfg.InlineWorkers = DefaultInlineWorkers
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.StandDownAfter <= 0 {
		cfg.StandDownAfter = DefaultStandDownAfter
	}
	if cfg.StandDownBackoff <= 0 {
		cfg.StandDownBackoff = DefaultStandDownBackoff
	}
	if cfg.guardRound <= 0 {
		cfg.guardRound = guardEvery
	}
	var plans planStore
	if cfg.JS != nil {
		ps := store.NewPlanStore(cfg.JS)
		ps.Publisher = nuid.Next()
		ps.Replicas = cfg.Replicas
		ps.LeaseName = bus.LeaseName
		plans = jsPlans{ps}
	}
	specs, inv := store.NewSpecStore(cfg.JS), store.NewInventoryStore(cfg.JS)
	specs.Replicas, inv.Replicas = cfg.Replicas, cfg.Replicas
	p := &Service{
		cfg:        cfg,
		plans:      plans,
		specs:      jsSpecs{specs},
		inv:        jsInventory{inv},
		drains:     newJSDrains(cfg.JS, cfg.Replicas),
		ownerStore: newJSOwners(cfg.JS, cfg.Replicas),
		link:       jsLink{nc: cfg.NC, js: cfg.JS},
		pulse:      newPulse(cfg.Clock.Now),
		clock:      cfg.Clock,
		marks:      newMarks(cfg.StateFile),
		fence:      fence{mu: newChanMutex()},
	}
	// The first snapshot is of nothing: Run's loop state publishes the
	// next.
	newLoopState(p).publishSnapshot(true)
	return p
}

// addState makes plan name's state (not loaded: its latest revision is
// read before its first replan) and returns it; one there is stays.
func (p *loopState) addState(name string) *planState {
	if s := p.states[name]; s != nil {
		return s
	}
	s := newPlanState(name, p.cfg.Log)
	// The nodes there are reported already, as far as this plan goes.
	for id := range p.live.docs {
		s.reported[id] = true
	}
	p.states[name] = s
	return s
}

// state is plan name's state, nil when no spec of that name is planned.
func (p *loopState) state(name string) *planState { return p.states[name] }

// planned are the plans the loop plans, by name: those with a spec, or
// whose removal is still to say, or whose last revision holds workers (a
// plan with no spec to plan on holds them).
func (p *loopState) planned() []*planState {
	var out []*planState
	for _, n := range slices.Sorted(maps.Keys(p.states)) {
		if s := p.states[n]; s.planned() {
			out = append(out, s)
		}
	}
	return out
}

// all are every plan's state, planned or not, by name.
func (p *loopState) all() []*planState {
	out := make([]*planState, 0, len(p.states))
	for _, n := range slices.Sorted(maps.Keys(p.states)) {
		out = append(out, p.states[n])
	}
	return out
}

// remember notes, in every plan's change log, that node id changed (old,
// present: its document before), as the view tells it.
func (p *loopState) remember(id string, old inventory.NodeInventory, present bool) {
	p.drain.touch(id)
	for _, s := range p.states {
		s.remember(id, old, present)
	}
}

// SpecDigest is the digest a plan message carries of its spec.
// It digests the parsed spec, not its bytes, so that a comment or
// whitespace edit is no spec change.
func SpecDigest(spec *planner.Spec) string {
	b, _ := json.Marshal(spec) // plain data: cannot fail; map keys sorted
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Run plans until ctx is done. It returns an error only for what waiting
// cannot mend (a bad plan name or spec); JetStream not answering at start,
// and outages later, are logged and ridden out.
func (p *Service) Run(ctx context.Context) error { return newLoopState(p).Run(ctx) }

// Run is Service.Run on this loop state, which the loop's goroutine (the
// caller's) then holds: a test driving a Service by hand runs its loop
// on the state it drove.
func (p *loopState) Run(ctx context.Context) error {
	if err := store.ValidatePlanName(p.cfg.Plan); err != nil {
		return err
	}
	if len(p.cfg.Spec) > 0 {
		if _, err := planner.ParseSpec(p.cfg.Spec); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
	}
	if err := p.marks.load(); err != nil {
		return err
	}
	if p.plans != nil {
		// Named in the state file, this planner's lease is known for its
		// predecessor's by the next planner on this state, should this
		// one die without giving it back.
		if err := p.marks.claim(p.plans.Publisher()); err != nil {
			p.cfg.Log.Warn().Err(err).Msg("cannot name this planner in its state file: a planner restarted on it takes this one's lease, should it be left behind, for another planner's")
		}
	}
	latest, ok, err := p.startRetrying(ctx)
	if err != nil || !ok {
		return err
	}
	own := p.addState(p.cfg.Plan)
	latest = p.aboveMark(own, latest)
	own.latest, own.loaded = latest, true
	if latest != nil {
		p.learnOwners(latest.Plan) // before any node's document
	}
	p.loadOwners(ctx)
	if latest != nil && latest.Plan.Placed() {
		own.inherited = latest.Plan
	}
	own.reconcile = latest != nil
	p.publishSnapshot(true)
	// Its gauges say the latest at once, not at the next revision.
	p.gauges(own, latest)
	p.ready = make(chan struct{})
	if !p.cfg.NoService {
		svc, err := bus.AddService(p.cfg.NC, api.Endpoints(p))
		if err != nil {
			return err
		}
		defer func() { _ = svc.Stop() }()
	}
	l, err := p.newLoop(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	p.fence.elected.Store(true)
	p.leaderGauges()
	defer l.close()
	return l.run(ctx)
}

// startRetrying makes the streams and buckets and reads the latest plan,
// waiting for JetStream as long as it takes: NATS may not be up yet (a
// compose file starting everything at once). false means ctx ended; an
// error, that waiting cannot mend it (too few servers for --replicas).
func (p *Service) startRetrying(ctx context.Context) (*store.StoredPlan, bool, error) {
	begin := p.clock.Now()
	for attempt := 0; ; attempt++ {
		latest, err := p.start(ctx)
		if err == nil {
			return latest, true, nil
		}
		elapsed := p.clock.Now().Sub(begin)
		// Fewer servers than --replicas is a setting to change, unless the
		// rest have not joined yet: the server says both alike, so the
		// first minute tells them apart.
		mayForm := bus.MayBeForming(err)
		forming := mayForm && elapsed < bus.StartGrace
		if !forming && (errors.Is(err, bus.ErrReplicas) || errors.Is(err, bus.ErrStorage) || errors.Is(err, errSpecLost)) {
			if mayForm {
				err = fmt.Errorf("%w (still after %s: no more servers joined)", err, elapsed.Round(time.Second))
			}
			return nil, false, err
		}
		if ctx.Err() != nil {
			return nil, false, nil
		}
		wait := bus.Backoff(attempt)
		if forming {
			p.cfg.Metrics.StartRetried("forming")
			p.cfg.Log.Info().Err(err).Str("retry_in", dur(wait)).Str("gives_up_in", dur(bus.StartGrace-elapsed)).
				Msg("fewer JetStream servers than --replicas so far: the cluster may still be forming; retrying")
		} else {
			p.cfg.Metrics.StartRetried("unavailable")
			// A cluster forming answers nothing for a while: expected at
			// first (bus.StartGrace), a warning past it.
			p.cfg.Log.WithLevel(bus.StartLevel(elapsed)).Err(err).Str("retry_in", dur(wait)).
				Msg("cannot start (JetStream away, or the stream refuses); retrying")
		}
		c, stop := p.after(wait)
		select {
		case <-ctx.Done():
			stop()
			return nil, false, nil
		case <-c:
		}
	}
}

// start makes sure the plan stream exists, stores the configured spec if
// it differs from the stored one, and reads the latest plan.
func (p *Service) start(ctx context.Context) (*store.StoredPlan, error) {
	// Each request below is bounded by the client's own timeout; reading
	// the latest (a large plan's snapshot, by a consumer) by ours, so
	// that a store that does not answer is said and retried, not waited
	// on for ever.
	if err := p.plans.Ensure(ctx); err != nil {
		return nil, err
	}
	if _, err := p.specs.Ensure(ctx); err != nil {
		return nil, err
	}
	if _, err := p.inv.Ensure(ctx); err != nil {
		return nil, err
	}
	if _, err := p.drains.Ensure(ctx); err != nil {
		return nil, err
	}
	// Made here, with the others, rather than at its first read: planners
	// starting together on a cluster race to make each bucket, a make can
	// time out, and here that is retried quietly while the cluster forms.
	if err := p.ownerStore.Ensure(ctx); err != nil {
		return nil, err
	}
	if err := p.seedSpec(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, max(6*p.cfg.StoreTimeout, time.Minute))
	defer cancel()
	return p.plans.Latest(ctx, p.cfg.Plan)
}

// ObserveRequest implements bus.RequestObserver.
func (p *Service) ObserveRequest(endpoint, code string, took time.Duration) {
	p.cfg.Metrics.Request(endpoint, code, took)
}

// sameSpec reports whether two specs plan alike (comments and layout
// aside); one that does not parse differs.
func sameSpec(a, b []byte) bool {
	sa, ea := planner.ParseSpec(a)
	sb, eb := planner.ParseSpec(b)
	return ea == nil && eb == nil && SpecDigest(sa) == SpecDigest(sb)
}

// planLog is the log of the configured plan (Config.Plan).
func (p *Service) planLog() *zerolog.Logger {
	l := p.cfg.Log.With().Str("plan", p.cfg.Plan).Logger()
	return &l
}

// seedSpec stores the configured spec as the plan's when the plan has
// none. A stored spec that differs was set since (planner spec set, or
// another planner's --spec): the live one wins, said in a warning,
// unless ReplaceSpec says the file does.
func (p *Service) seedSpec(ctx context.Context) error {
	if len(p.cfg.Spec) == 0 {
		return nil
	}
	stored, err := p.specs.Entry(ctx, p.cfg.Plan)
	cur, rev := stored.Spec, stored.Revision
	seeded := func(kind SeedKind) {
		if p.cfg.SpecSeeded != nil {
			p.cfg.SpecSeeded(SpecSeed{Plan: p.cfg.Plan, Kind: kind, Revision: rev, Stored: stored.Updated})
		}
	}
	if errors.Is(err, client.ErrNotFound) && !p.cfg.ReplaceSpec {
		if lost := p.specLost(ctx); lost != nil {
			return lost
		}
	}
	switch {
	case err != nil && !errors.Is(err, client.ErrNotFound):
		return err
	case err == nil && sameSpec(cur, p.cfg.Spec):
		seeded(SeedSame)
		return nil
	case err != nil && p.cfg.ReplaceSpec:
		p.planLog().Warn().Msg("--replace-spec: no stored spec could be read; storing --spec")
	case err != nil:
		// None stored: create, so that of two planners starting at once
		// the first one's stays.
		kv, kerr := p.specs.Bucket(ctx)
		if kerr != nil {
			return kerr
		}
		if _, cerr := kv.Create(ctx, p.cfg.Plan, p.cfg.Spec); cerr != nil && !errors.Is(cerr, jetstream.ErrKeyExists) {
			return fmt.Errorf("store spec %s: %w", p.cfg.Plan, cerr)
		} else if cerr == nil {
			seeded(SeedStored)
		}
		return nil
	case err == nil && !p.cfg.ReplaceSpec:
		p.planLog().Warn().Uint64("spec_revision", rev).
			Msg("the stored spec differs from --spec: keeping the stored one, set since (planner spec set); --replace-spec makes the file win")
		seeded(SeedKept)
		return nil
	case err == nil:
		p.planLog().Info().Uint64("replaced_revision", rev).Msg("--replace-spec: storing --spec over the stored spec")
	}
	_, err = p.specs.Put(ctx, p.cfg.Plan, p.cfg.Spec)
	if err == nil {
		seeded(SeedReplaced)
	}
	return err
}

// SpecSeed is what the planner made at start of its configured spec
// (Config.Spec) beside the plan's stored one.
type SpecSeed struct {
	Plan string
	Kind SeedKind
	// Revision and Stored are the stored spec's, as found at start: the
	// one kept (SeedKept, SeedSame) or replaced (SeedReplaced); zero
	// when there was none.
	Revision uint64
	Stored   time.Time
}

// SeedKind is what became of the configured spec.
type SeedKind int

// The kinds of SpecSeed.
const (
	// SeedStored: the plan had no spec; the configured one is stored.
	SeedStored SeedKind = iota + 1
	// SeedSame: the stored spec plans as the configured one does.
	SeedSame
	// SeedKept: the stored spec differs and stays in force; the
	// configured one is not used (ReplaceSpec unset).
	SeedKept
	// SeedReplaced: the stored spec differed and the configured one
	// replaced it (ReplaceSpec).
	SeedReplaced
)

// errSpecLost is seedSpec's refusal to store --spec where the spec
// bucket lost what it held: waiting does not mend it.
var errSpecLost = errors.New("the spec bucket lost its contents")

// specLost says why, when the spec bucket shows it lost the plan's
// spec (a damaged or truncated store), that --spec must not silently
// take its place. It judges the plan's own key, not the bucket as a
// whole: its record listed but unreadable (a flipped byte), or gone
// without a removal's marker while the plan's latest revision says it
// was never removed; or, where the bucket says nothing of the key, the
// bucket holding none of the messages it stored, or reporting some
// lost. Nil when the key is whole, as far as it can tell (a bucket made
// anew, a spec never stored, or one removed, whose marker stays).
func (p *Service) specLost(ctx context.Context) error {
	s, err := p.link.Stream(ctx, "KV_"+client.SpecBucket)
	if err != nil {
		return nil // Get read the bucket: an error here is an outage's
	}
	if s.LastSeq == 0 {
		return nil // made anew: nothing stored, nothing lost
	}
	refuse := func(what string) error {
		return fmt.Errorf("%w: plan %s has no readable spec in bucket %s: %s: "+
			"its spec may have been lost (a damaged store); not replacing it with --spec unasked: store it again (planner spec set), "+
			"or start with --replace-spec to store --spec", errSpecLost, p.cfg.Plan, client.SpecBucket, what)
	}
	recs, err := p.specs.Records(ctx)
	if err != nil {
		return nil
	}
	if recs.Unreadable[p.cfg.Plan] {
		return refuse("the server lists its record but cannot read it")
	}
	if recs.Keys[p.cfg.Plan] {
		return nil // a removal's marker
	}
	lctx, cancel := context.WithTimeout(ctx, max(6*p.cfg.StoreTimeout, time.Minute))
	defer cancel()
	if sp, err := p.plans.Latest(lctx, p.cfg.Plan); err == nil && sp != nil && !sp.Plan.Removed() {
		return refuse(fmt.Sprintf("its record is gone without a removal, and its revision %d says it was never removed", sp.Plan.Revision))
	}
	if s.Lost == 0 && s.Msgs > 0 {
		return nil
	}
	return refuse(fmt.Sprintf("the bucket has stored %d messages and holds %d (%d reported lost)", s.LastSeq, s.Msgs, s.Lost))
}
