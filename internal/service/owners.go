package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// ownerBook persists which node owns each GPU UUID (its first holder)
// in bus.OwnersBucket, so that a planner started at any time, while a
// node is away and another lists its GPUs, still gives them back to it
// when it returns (inventory.Claims.Owned). The loop hands it the
// owners its claims inferred while it leads (saveOwners); its own
// goroutine (run) alone writes the bucket.
type ownerBook struct {
	store ownerStore
	saves chan map[string][]string
	// failed is the writer's last pass's failure (nil: none), which the
	// loop says as a problem: the writer never touches the loop's state.
	failed atomic.Pointer[error]
	// loaded brings the owners read again (reread) after the read at
	// start failed.
	loaded chan map[string]string
	// said is whether the loop says the failure now; unread, whether
	// the owners are still to be read (the read at start failed): the
	// loop alone uses them.
	said   bool
	unread bool
	// resave is set when the bucket was lost: every owner this planner
	// knows is handed to the writer again (the loop alone uses it).
	resave bool
}

// failure is the writer's last failure, nil once a pass succeeded.
func (b *ownerBook) failure() error {
	if err := b.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// ownersWindow is how many nodes' records are written at once: a
// cluster's first start records every node (20,000 creates), in the
// background, and must not crowd out the reporters' first puts and the
// first revision's assignments on the same servers.
const ownersWindow = 8

// loadOwners reads the persisted owners into the live claims before
// any node's document, and starts the writer. A bucket that cannot be
// read leaves ownership to this process's memory meanwhile: said in a
// log line and a problem until a later read succeeds; reread tries
// again every ownersRetry off the loop, and the loop takes what it
// reads at a guard round (retryOwners), never waiting on the store.
func (p *loopState) loadOwners(ctx context.Context) {
	p.owners = &ownerBook{store: p.ownerStore, saves: make(chan map[string][]string, 16), loaded: make(chan map[string]string, 1)}
	lctx, cancel := context.WithTimeout(ctx, max(p.cfg.StoreTimeout, 10*time.Second))
	owners, err := p.ownerStore.Load(lctx)
	if missingBucket(err) {
		owners, err = p.loadOwnersAgain(ctx)
	}
	cancel()
	if err != nil {
		p.cfg.Log.Warn().Err(err).Msg("cannot read the GPU UUID owners: ownership goes by what this planner sees until they are read (tried again every 10 s)")
		p.owners.unread = true
		p.problem("owners:read", fmt.Sprintf("cannot read the GPU UUID owners (%v): a node away while another lists its GPUs may not get them back", err))
		go p.owners.reread(ctx, p.cfg.Log, p.clock, p.cfg.StoreTimeout)
	}
	p.learnOwned(owners)
	go p.owners.run(ctx, p.cfg.Log, p.clock, p.cfg.StoreTimeout)
}

// ownersNotKnownFor is how long, at most, a planner at start makes and
// reads again an owners bucket a server says is not there.
const ownersNotKnownFor = 2 * time.Second

// loadOwnersAgain makes the owners bucket and reads it again, a tenth
// of a second at a time, for up to ownersNotKnownFor in all: made a
// moment ago (start), a server of a cluster still forming may not know
// it yet (CI: TestHAStartQuiet's leader read "bucket not found"), or it
// was deleted since. Real time: the loop has not started, and a test's
// clock may never move; the bound keeps the planner's start (its
// request service comes after) from waiting on a store that does not
// answer.
func (p *loopState) loadOwnersAgain(ctx context.Context) (map[string]string, error) {
	rctx, cancel := context.WithTimeout(ctx, ownersNotKnownFor)
	defer cancel()
	for {
		_ = p.ownerStore.Ensure(rctx)
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-rctx.Done():
		case <-t.C:
		}
		t.Stop()
		owners, err := p.ownerStore.Load(rctx)
		if !missingBucket(err) || rctx.Err() != nil {
			return owners, err
		}
	}
}

// missingBucket reports whether err says the owners bucket (or its
// stream) is not there.
func missingBucket(err error) bool {
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// ownersRetry is how often a planner that could not read the owners
// tries again.
const ownersRetry = 10 * time.Second

// learnOwned puts persisted owners into the live claims, over what this
// planner inferred.
func (p *loopState) learnOwned(owners map[string]string) {
	for u, n := range owners {
		p.live.claims.Owned(u, n)
	}
}

// retryOwners takes the owners reread brought, if it has: they decide
// from then on, and the problem goes.
func (p *loopState) retryOwners() {
	if p.owners == nil || !p.owners.unread {
		return
	}
	select {
	case owners := <-p.owners.loaded:
		p.cfg.Log.Info().Int("uuids", len(owners)).Msg("read the GPU UUID owners")
		p.owners.unread = false
		p.problem("owners:read", "")
		p.learnOwned(owners)
	default:
	}
}

// reread reads the owners every ownersRetry until a read succeeds, and
// hands the loop what it read (loaded).
func (b *ownerBook) reread(ctx context.Context, log zerolog.Logger, clock Clock, timeout time.Duration) {
	t := clock.NewTimer(ownersRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if owners, ok := b.tryLoad(ctx, log, timeout); ok {
			b.loaded <- owners // cap 1, and the only send
			return
		}
		t.Reset(ownersRetry)
	}
}

// tryLoad is one read of the owners, bounded by timeout (at least 10 s).
func (b *ownerBook) tryLoad(ctx context.Context, log zerolog.Logger, timeout time.Duration) (map[string]string, bool) {
	lctx, cancel := context.WithTimeout(ctx, max(timeout, 10*time.Second))
	defer cancel()
	owners, err := b.store.Load(lctx)
	if err != nil {
		log.Debug().Err(err).Msg("cannot read the GPU UUID owners yet")
		return nil, false
	}
	return owners, true
}

// saveOwners hands the owners the claims inferred to the writer, while
// this planner leads (a standby keeps them until it leads: the leader
// writes its own). A busy writer gets them at a later event.
func (p *loopState) saveOwners() {
	if p.owners == nil {
		return
	}
	if err := p.owners.failure(); err != nil {
		p.problem("owners:write", fmt.Sprintf("cannot record the GPU UUID owners (%v): a planner started later may take a squatter for a node's GPUs' owner", err))
		p.owners.said = true
	} else if p.owners.said {
		p.problem("owners:write", "")
		p.owners.said = false
	}
	// Owners inferred before the records were read are kept back: the
	// records may say otherwise (Owned), and a write would make this
	// planner's guess a record.
	if p.leading() == 0 || p.owners.unread || len(p.owners.saves) == cap(p.owners.saves) {
		return
	}
	if p.owners.resave {
		// The bucket was lost: all of them, the unsaved among them.
		p.live.claims.TakeUnsaved()
		if all := p.live.claims.Owners(); all != nil {
			p.owners.saves <- all
		}
		p.owners.resave = false
		return
	}
	if u := p.live.claims.TakeUnsaved(); u != nil {
		p.owners.saves <- u
	}
}

// run writes what saves brings until ctx ends; what fails is tried
// again a second later.
func (b *ownerBook) run(ctx context.Context, log zerolog.Logger, clock Clock, timeout time.Duration) {
	pending := map[string][]string{}
	retry := clock.NewTimer(time.Hour)
	retry.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case u := <-b.saves:
			for n, us := range u {
				pending[n] = append(pending[n], us...)
			}
		case <-retry.C():
		}
		err := b.write(ctx, pending, clock.Now(), max(timeout, 10*time.Second))
		if err != nil && !failing {
			log.Warn().Err(err).Msg("cannot record GPU UUID owners; trying again")
		}
		if err != nil {
			retry.Reset(time.Second)
		}
		failing = err != nil
		if err != nil {
			b.failed.Store(&err)
		} else {
			b.failed.Store(nil)
		}
	}
}

// write records pending's owners, ownersWindow nodes at once, and
// leaves in it those that failed; the first failure is returned.
func (b *ownerBook) write(ctx context.Context, pending map[string][]string, now time.Time, timeout time.Duration) error {
	var mu sync.Mutex
	var first error
	slots := make(chan struct{}, ownersWindow)
	var wg sync.WaitGroup
	done := make([]string, 0, len(pending))
	for _, n := range slices.Sorted(maps.Keys(pending)) {
		us := pending[n]
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			wctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			err := b.store.Add(wctx, n, us, now)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			done = append(done, n)
		})
	}
	wg.Wait()
	for _, n := range done {
		delete(pending, n)
	}
	return first
}
