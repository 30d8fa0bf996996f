package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

// reporterRequests bounds the in-process reporters' requests in flight
// at once. Twenty thousand simulated reporters starting together sent a
// key read and a put each at the same moment: the server's JetStream API
// queue (10,000) dropped half the reads, the rest timed out, and every
// put was retried, seconds lost. A few hundred at a time keep the
// server busy without queueing past its limit.
const reporterRequests = 256

// pacedStore is the inventory store as the in-process reporters share
// it: every request waits for one of a fixed number of slots.
type pacedStore struct {
	inner reporter.Store
	slots chan struct{}
}

var _ reporter.Store = (*pacedStore)(nil)

func newPacedStore(inner reporter.Store, inFlight int) *pacedStore {
	return &pacedStore{inner: inner, slots: make(chan struct{}, inFlight)}
}

// take waits for a slot; the caller gives it back.
func (p *pacedStore) take(ctx context.Context, what, nodeID string) error {
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s of node %s: waiting for the reporters' turn: %w", what, nodeID, ctx.Err())
	}
}

func (p *pacedStore) give() { <-p.slots }

// PutIf is the inner store's, in turn.
func (p *pacedStore) PutIf(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration, last uint64) (uint64, error) {
	if err := p.take(ctx, "put", nodeID); err != nil {
		return 0, err
	}
	defer p.give()
	return p.inner.PutIf(ctx, nodeID, doc, heartbeat, ttl, last)
}

// DeleteIf is the inner store's, in turn.
func (p *pacedStore) DeleteIf(ctx context.Context, nodeID string, ttl time.Duration, last uint64) error {
	if err := p.take(ctx, "delete", nodeID); err != nil {
		return err
	}
	defer p.give()
	return p.inner.DeleteIf(ctx, nodeID, ttl, last)
}

// State is the inner store's, in turn.
func (p *pacedStore) State(ctx context.Context, nodeID string) (store.KeyState, error) {
	if err := p.take(ctx, "key read", nodeID); err != nil {
		return store.KeyState{}, err
	}
	defer p.give()
	return p.inner.State(ctx, nodeID)
}
