package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/inventory"
)

// Inventory bucket settings. Reporters and the planner both create the
// bucket if it is missing, so they must agree on every setting: a
// create-or-update with different settings would flip the bucket's
// configuration back and forth.
const (
	// InventoryHistory is how many revisions per key are kept, for audit
	// of the last changes. Every revision carries the reporter's TTL, so
	// history never outlives the node by more than one TTL.
	InventoryHistory = 16
	// InventoryMarkerTTL is how long the purge marker of an expired key
	// stays; watchers see it live. It is also the floor the server
	// imposes on every per-key TTL, so it must not exceed the shortest
	// --ttl; one second is the least the server allows.
	InventoryMarkerTTL = time.Second
)

// InventoryBucketConfig returns the bucket's settings: file storage, no
// bucket-wide TTL (each put carries its reporter's own --ttl), limit
// markers on, so that an expired key reaches watchers as a purge.
func InventoryBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         InventoryBucket,
		Description:    "poolplanner node inventories, key = node id",
		History:        InventoryHistory,
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: InventoryMarkerTTL,
	}
}

// KeyTTL rounds ttl up to the whole seconds the server counts message
// TTLs in, and to at least InventoryMarkerTTL, which the server would
// impose anyway.
func KeyTTL(ttl time.Duration) time.Duration {
	ttl = (ttl + time.Second - 1).Truncate(time.Second)
	return max(ttl, InventoryMarkerTTL)
}

// InventoryStore reads and writes the inventory bucket. Creating one does
// no I/O; the bucket is created on first use and again whenever it has
// gone missing (a server that lost its storage), so a reporter never has
// to care whether NATS was up when it started.
type InventoryStore struct {
	js jetstream.JetStream
	// kv is the bucket once it is known to exist.
	kv atomic.Pointer[jetstream.KeyValue]
}

// NewInventoryStore returns a store over js.
func NewInventoryStore(js jetstream.JetStream) *InventoryStore {
	return &InventoryStore{js: js}
}

// Ensure creates the bucket if it is missing, or brings its settings to
// InventoryBucketConfig.
func (s *InventoryStore) Ensure(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, InventoryBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", InventoryBucket, err)
	}
	s.kv.Store(&kv)
	return kv, nil
}

// KV returns the bucket, creating it if needed; for reads the store does
// not wrap (history, keys).
func (s *InventoryStore) KV(ctx context.Context) (jetstream.KeyValue, error) {
	if kv := s.kv.Load(); kv != nil {
		return *kv, nil
	}
	return s.Ensure(ctx)
}

// Put stores doc (a NodeInventory as JSON) under nodeID with a TTL. A
// heartbeat put must carry the same bytes as the last change; it is
// marked with HeartbeatHeader so that watchers can skip it without
// reading the value. It returns the revision.
func (s *InventoryStore) Put(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration) (uint64, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return 0, err
	}
	if _, err := s.KV(ctx); err != nil {
		return 0, fmt.Errorf("put inventory %s: %w", nodeID, err)
	}
	msg := &nats.Msg{Subject: InventorySubject(nodeID), Header: nats.Header{}, Data: doc}
	if heartbeat {
		msg.Header.Set(HeartbeatHeader, "1")
	}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(KeyTTL(ttl)))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		// The bucket vanished under us (a server restarted without its
		// storage): make it again and retry once.
		s.kv.Store(nil)
		if _, err = s.Ensure(ctx); err == nil {
			ack, err = s.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(KeyTTL(ttl)))
		}
	}
	if err != nil {
		return 0, fmt.Errorf("put inventory %s: %w", nodeID, err)
	}
	return ack.Sequence, nil
}

// Delete removes nodeID's key: watchers see a KV delete. The delete
// marker itself expires after ttl, so a bucket whose nodes come and go
// does not fill with markers.
func (s *InventoryStore) Delete(ctx context.Context, nodeID string, ttl time.Duration) error {
	if err := ValidateNodeID(nodeID); err != nil {
		return err
	}
	if _, err := s.KV(ctx); err != nil {
		return fmt.Errorf("delete inventory %s: %w", nodeID, err)
	}
	// jetstream.KeyValue.Delete refuses a TTL, so write the marker as KV
	// does (KV-Operation: DEL) with our own TTL.
	msg := nats.NewMsg(InventorySubject(nodeID))
	msg.Header.Set("KV-Operation", "DEL")
	if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(KeyTTL(ttl))); err != nil {
		return fmt.Errorf("delete inventory %s: %w", nodeID, err)
	}
	return nil
}

// Get returns nodeID's inventory and its revision; jetstream.ErrKeyNotFound
// when the node is not reporting.
func (s *InventoryStore) Get(ctx context.Context, nodeID string) (inventory.NodeInventory, uint64, error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return inventory.NodeInventory{}, 0, fmt.Errorf("get inventory %s: %w", nodeID, err)
	}
	e, err := kv.Get(ctx, nodeID)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyDeleted) {
			err = jetstream.ErrKeyNotFound
		}
		return inventory.NodeInventory{}, 0, fmt.Errorf("get inventory %s: %w", nodeID, err)
	}
	var inv inventory.NodeInventory
	if err := json.Unmarshal(e.Value(), &inv); err != nil {
		return inventory.NodeInventory{}, 0, fmt.Errorf("get inventory %s: revision %d: %w", nodeID, e.Revision(), err)
	}
	return inv, e.Revision(), nil
}

// List returns the inventories of all reporting nodes, by node id.
func (s *InventoryStore) List(ctx context.Context) ([]inventory.NodeInventory, error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return nil, fmt.Errorf("list inventory: %w", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list inventory: %w", err)
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k)
	}
	var out []inventory.NodeInventory
	for _, id := range ids {
		inv, _, err := s.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired between listing and reading
		}
		if err != nil {
			return nil, fmt.Errorf("list inventory: %w", err)
		}
		out = append(out, inv)
	}
	return out, nil
}

// EventOp says what happened to a key.
type EventOp int

// Event operations.
const (
	// Changed: a new inventory; Event.Inventory holds it.
	Changed EventOp = iota + 1
	// Heartbeat: the reporter is alive and its inventory unchanged.
	Heartbeat
	// Removed: the reporter deleted its key (shut down) or the key expired
	// (the reporter died); Event.Reason says which.
	Removed
	// Synced: every key that existed when the watch started has been
	// delivered; sent once.
	Synced
)

func (o EventOp) String() string {
	switch o {
	case Changed:
		return "changed"
	case Heartbeat:
		return "heartbeat"
	case Removed:
		return "removed"
	case Synced:
		return "synced"
	}
	return "EventOp(" + strconv.Itoa(int(o)) + ")"
}

// Removal reasons.
const (
	ReasonDeleted = "deleted" // the reporter shut down and deleted its key
	ReasonExpired = "expired" // the key's TTL ran out: the reporter died
	ReasonPurged  = "purged"  // an operator purged the key
)

// Event is one change to the inventory bucket as a watcher sees it.
type Event struct {
	Op       EventOp
	NodeID   string
	Revision uint64
	// Inventory is set for Changed.
	Inventory inventory.NodeInventory
	// Reason is set for Removed.
	Reason string
	// ExpiresAt is when the key will vanish unless refreshed, for Changed
	// and Heartbeat; zero if the put carried no TTL.
	ExpiresAt time.Time
}

// Watch follows the bucket: first the latest state of every key, then a
// Synced event, then every change. It reads headers only and fetches a
// value only for a change, so a heartbeat costs a watcher about 200 bytes
// whatever the size of the inventory. The channel is closed when ctx is
// done or the watch fails.
//
// The watch resumes by itself after a reconnect, but a purge marker that
// came and went (InventoryMarkerTTL) while it was cut off is not
// replayed; a watcher that must not miss an expiry also checks ExpiresAt.
func (s *InventoryStore) Watch(ctx context.Context) (<-chan Event, error) {
	if _, err := s.KV(ctx); err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	cons, err := s.js.OrderedConsumer(ctx, InventoryStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{InventorySubjectPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	out := make(chan Event, 64)
	ended := stopOnDone(ctx, it.Stop)
	go func() {
		defer close(out)
		defer close(ended)
		w := watcher{store: s, known: map[string]bool{}}
		// The initial state is the messages pending when the consumer was
		// made (one per key); later puts may already be pending too by the
		// first delivery, so count rather than wait for NumPending 0.
		var initial uint64
		if info := cons.CachedInfo(); info != nil {
			initial = info.NumPending
		}
		synced := initial == 0
		if synced && !send(ctx, out, Event{Op: Synced}) {
			return
		}
		var delivered uint64
		for {
			msg, err := it.Next()
			if err != nil {
				return // stopped, or the consumer could not be recreated
			}
			ev, ok := w.event(ctx, msg)
			if ok && !send(ctx, out, ev) {
				return
			}
			delivered++
			if md, err := msg.Metadata(); !synced && (delivered >= initial || err == nil && md.NumPending == 0) {
				synced = true
				if !send(ctx, out, Event{Op: Synced}) {
					return
				}
			}
		}
	}()
	return out, nil
}

func send(ctx context.Context, out chan<- Event, ev Event) bool {
	select {
	case out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

type watcher struct {
	store *InventoryStore
	// known holds the keys whose current inventory this watcher has
	// delivered; a heartbeat for any other key needs its value read.
	known map[string]bool
}

// event turns a headers-only message into an Event; false means skip it.
func (w *watcher) event(ctx context.Context, msg jetstream.Msg) (Event, bool) {
	nodeID, ok := strings.CutPrefix(msg.Subject(), InventorySubjectPrefix)
	if !ok {
		return Event{}, false
	}
	md, err := msg.Metadata()
	if err != nil {
		return Event{}, false
	}
	ev := Event{NodeID: nodeID, Revision: md.Sequence.Stream}
	h := msg.Headers()
	if reason := removal(h); reason != "" {
		delete(w.known, nodeID)
		ev.Op, ev.Reason = Removed, reason
		return ev, true
	}
	if ttl := h.Get(jetstream.MsgTTLHeader); ttl != "" {
		if secs, err := strconv.ParseInt(ttl, 10, 64); err == nil {
			ev.ExpiresAt = md.Timestamp.Add(time.Duration(secs) * time.Second)
		} else if d, err := time.ParseDuration(ttl); err == nil {
			ev.ExpiresAt = md.Timestamp.Add(d)
		}
	}
	if h.Get(HeartbeatHeader) != "" && w.known[nodeID] {
		ev.Op = Heartbeat
		return ev, true
	}
	// A value that cannot be read (expired or superseded since it was
	// delivered, NATS away, a document that does not parse) is skipped
	// and the key forgotten: the next heartbeat reads it again, instead
	// of passing for "unchanged" and hiding a change for ever.
	kv, err := w.store.KV(ctx)
	if err != nil {
		delete(w.known, nodeID)
		return Event{}, false
	}
	e, err := kv.GetRevision(ctx, nodeID, ev.Revision)
	if err != nil {
		delete(w.known, nodeID)
		return Event{}, false
	}
	if err := json.Unmarshal(e.Value(), &ev.Inventory); err != nil {
		delete(w.known, nodeID)
		return Event{}, false
	}
	w.known[nodeID] = true
	ev.Op = Changed
	return ev, true
}

// removal returns why a message removes its key, or "" for a put.
func removal(h nats.Header) string {
	switch h.Get("KV-Operation") {
	case "DEL":
		return ReasonDeleted
	case "PURGE":
		return ReasonPurged
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "":
		return ""
	case "MaxAge":
		return ReasonExpired
	case "Remove":
		return ReasonDeleted
	default:
		return ReasonPurged
	}
}
