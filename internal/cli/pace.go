package cli

import (
	"context"
	"errors"
	"time"

	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

// reporterRequests bounds the in-process reporters' requests in flight
// at once. Twenty thousand simulated reporters starting together sent a
// key read and a put each at the same moment: the server's JetStream API
// queue (10,000) dropped half the reads, the rest timed out, and every
// put was retried, seconds lost. Sixty-four at a time keep an
// in-process server busy without queueing past its limit, and keep a
// request's wait behind the others short: with 256 in flight a CI
// machine starved of CPU timed out 152 of 20,000 puts (each its 5 s).
const reporterRequests = 64

// pacedStore is the inventory store as the in-process reporters share
// it: every request waits for one of a fixed number of slots.
type pacedStore struct {
	inner reporter.Store
	slots chan struct{}
	// life is the reporters': when it ends, nobody waits for a turn.
	life context.Context
}

var _ reporter.Store = (*pacedStore)(nil)

func newPacedStore(life context.Context, inner reporter.Store, inFlight int) *pacedStore {
	return &pacedStore{inner: inner, slots: make(chan struct{}, inFlight), life: life}
}

// turn waits for a slot and returns the context to make the request in,
// and the function that gives the slot back. The wait is not the
// request's: its deadline (the reporter's put timeout) counts from the
// slot on, or 20,000 reporters queueing on a slow server would time out
// waiting and retry, the storm again. Once the reporters' life ends
// (shutdown) nobody waits: their last deletes go straight. Cancelling
// ctx, not its deadline passing, ends the request.
func (p *pacedStore) turn(ctx context.Context) (context.Context, func()) {
	budget := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl)
	}
	slot := false
	select {
	case p.slots <- struct{}{}:
		slot = true
	case <-p.life.Done():
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if budget >= 0 {
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), budget)
	}
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return rctx, func() {
		stop()
		cancel()
		if slot {
			<-p.slots
		}
	}
}

// PutIf is the inner store's, in turn.
func (p *pacedStore) PutIf(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration, last uint64) (uint64, error) {
	rctx, done := p.turn(ctx)
	defer done()
	return p.inner.PutIf(rctx, nodeID, doc, heartbeat, ttl, last)
}

// DeleteIf is the inner store's, in turn.
func (p *pacedStore) DeleteIf(ctx context.Context, nodeID string, ttl time.Duration, last uint64) error {
	rctx, done := p.turn(ctx)
	defer done()
	return p.inner.DeleteIf(rctx, nodeID, ttl, last)
}

// State is the inner store's, in turn.
func (p *pacedStore) State(ctx context.Context, nodeID string) (store.KeyState, error) {
	rctx, done := p.turn(ctx)
	defer done()
	return p.inner.State(rctx, nodeID)
}
