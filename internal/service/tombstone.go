package service

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/store"
)

// An inventory key whose TTL runs out leaves nothing in the stream: the
// bucket refuses rollups, and the server writes expiry markers only
// where they are allowed. A watcher that saw the key's last put (`nats
// kv watch`, a dashboard) would show the node alive for ever. The
// planner's own watch notices expiries (bus.Watch notes each key's TTL),
// and the leading planner then writes the key's delete marker, a
// tombstone (store.InventoryStore.Tombstone), so that every watcher sees
// the node go. It is written only if the key still holds nothing (its
// subject's expected last sequence is 0, as the planner found it): a
// reporter that came back meanwhile keeps its key. A standby keeps the
// expiries it noticed, and writes those still due when it leads.

// DefaultTombstoneTTL is how long a tombstone lasts when the key's TTL
// is not known (a reporter's default: 3 heartbeats of 5 s).
const DefaultTombstoneTTL = 15 * time.Second

// tombstones are the expired keys whose delete marker is still to write,
// and the TTL and last revision of each live key, to write it with.
type tombstones struct {
	p   *Service
	log zerolog.Logger
	// mu guards due (the loop adds, run's goroutine writes and drops);
	// innermost: nothing is locked while it is held.
	mu  sync.Mutex
	due map[string]tomb
	// keys is each live key's TTL and last revision as the watch
	// delivered them (the loop's goroutine alone uses it).
	keys map[string]tomb
	wake chan struct{}
	// said is the last failure logged (run's goroutine alone uses it):
	// a failing write is said once, not at every retry.
	said string
}

// tomb is a key's TTL and the last revision of it the planner saw.
type tomb struct {
	ttl  time.Duration
	seen uint64
}

func newTombstones(p *Service, log zerolog.Logger) *tombstones {
	return &tombstones{p: p, log: log, due: map[string]tomb{}, keys: map[string]tomb{}, wake: make(chan struct{}, 1)}
}

// event takes an inventory event: a key that is alive, or gone by a
// message in the stream, needs no tombstone; one whose TTL the watch
// saw run out does.
func (t *tombstones) event(ev store.Event) {
	switch {
	case ev.Op == store.Changed || ev.Op == store.Heartbeat || ev.Op == store.Rejected:
		t.keys[ev.NodeID] = tomb{ttl: ev.TTL, seen: ev.Revision}
		t.settled(ev.NodeID)
	case ev.Op == store.Removed && ev.Marker:
		delete(t.keys, ev.NodeID)
		t.settled(ev.NodeID)
	case ev.Op == store.Removed:
		k := tomb{ttl: ev.TTL, seen: ev.Revision}
		if k.ttl == 0 {
			k.ttl = t.keys[ev.NodeID].ttl
		}
		if k.seen == 0 {
			k.seen = t.keys[ev.NodeID].seen
		}
		t.expired(ev.NodeID, k)
	}
}

// vanished takes keys gone while the watch was away (a resync): why is
// not known, and a tombstone is written where the key holds nothing.
func (t *tombstones) vanished(ids []string) {
	for _, id := range ids {
		t.expired(id, t.keys[id])
	}
}

// expired notes that node id's key ran out.
func (t *tombstones) expired(id string, k tomb) {
	delete(t.keys, id)
	t.mu.Lock()
	t.due[id] = k
	t.mu.Unlock()
	cue(t.wake)
}

// settled drops node id's tombstone, if one is due: the key was put
// again, or a marker says it went.
func (t *tombstones) settled(id string) {
	t.mu.Lock()
	delete(t.due, id)
	t.mu.Unlock()
}

// pending lists the nodes whose tombstone is due, sorted.
func (t *tombstones) pending() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.due))
}

// run writes the tombstones due while this planner leads, until ctx
// ends; a write that fails (NATS away) is tried again a second later.
func (t *tombstones) run(ctx context.Context) {
	retry := t.p.clock.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-retry.C():
		}
		if !t.write(ctx) {
			retry.Reset(time.Second)
		}
	}
}

// write writes every tombstone due, while this planner leads; false when
// some failed and are to be tried again.
func (t *tombstones) write(ctx context.Context) bool {
	ok := true
	for _, id := range t.pending() {
		if t.p.leading() == 0 || ctx.Err() != nil {
			return true // the leader writes them; this planner, when it leads
		}
		t.mu.Lock()
		k, due := t.due[id]
		t.mu.Unlock()
		if !due {
			continue
		}
		ttl := k.ttl
		if ttl <= 0 {
			ttl = DefaultTombstoneTTL
		}
		wctx, cancel := context.WithTimeout(ctx, t.p.cfg.StoreTimeout)
		rev, err := t.p.inv.Tombstone(wctx, id, ttl, k.seen)
		cancel()
		switch {
		case err == nil:
			t.log.Debug().Str("node", id).Uint64("revision", rev).Uint64("last_seen", k.seen).
				Msg("the node's inventory key expired: wrote its delete marker, so that every watcher sees it go")
		case errors.Is(err, store.ErrKeyMoved):
			t.log.Debug().Str("node", id).Msg("the node's inventory key was written again since it expired: no delete marker")
		case ctx.Err() != nil:
			return true
		default:
			if ok && err.Error() != t.said {
				t.log.Warn().Err(err).Str("node", id).Msg("cannot write the delete marker of an expired inventory key; retrying")
				t.said = err.Error()
			}
			ok = false
			continue
		}
		t.said = ""
		t.mu.Lock()
		if t.due[id] == k {
			delete(t.due, id)
		}
		t.mu.Unlock()
	}
	return ok
}
