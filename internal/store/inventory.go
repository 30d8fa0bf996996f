package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// InventoryStore reads and writes the inventory bucket. Creating one does
// no I/O; the bucket is created on first use and again whenever it has
// gone missing (a server that lost its storage), so a reporter never has
// to care whether NATS was up when it started.
type InventoryStore struct {
	// NoCreate keeps the store from creating the bucket: a reporter
	// whose credentials may only write its own key waits for the planner.
	NoCreate bool
	// Replicas is how many servers keep the bucket (0: one).
	Replicas int
	js       jetstream.JetStream
	// kv is the bucket once it is known to exist.
	kv atomic.Pointer[jetstream.KeyValue]
	// shared holds the strings the documents it decodes repeat.
	shared *inventory.Strings
}

// NewInventoryStore returns a store over js.
func NewInventoryStore(js jetstream.JetStream) *InventoryStore {
	return &InventoryStore{js: js, shared: inventory.NewStrings()}
}

// Ensure creates the bucket if it is missing, or brings its settings to
// InventoryStreamConfig.
func (s *InventoryStore) Ensure(ctx context.Context) (jetstream.KeyValue, error) {
	cfg := bus.InventoryStreamConfig(s.Replicas)
	if _, err := bus.CreateOrUpdate(ctx, func(ctx context.Context) (jetstream.Stream, error) { return s.js.CreateStream(ctx, cfg) },
		func(ctx context.Context) (jetstream.Stream, error) { return s.js.UpdateStream(ctx, cfg) }); err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", client.InventoryBucket, bus.ReplicasErr(err, s.Replicas))
	}
	// Made or found, the stream can still be "not found" for a moment to
	// the server answering its info, in a loaded cluster (one that has
	// not applied the create its peers answered): asked again, briefly.
	kv, err := s.js.KeyValue(ctx, client.InventoryBucket)
	for wait := 20 * time.Millisecond; errors.Is(err, jetstream.ErrBucketNotFound) && wait < time.Second; wait *= 2 {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ensure bucket %s: %w", client.InventoryBucket, ctx.Err())
		case <-time.After(wait):
		}
		kv, err = s.js.KeyValue(ctx, client.InventoryBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", client.InventoryBucket, err)
	}
	s.kv.Store(&kv)
	return kv, nil
}

// ErrNoBucket is a store that may not create the bucket finding it
// missing: the planner makes it.
var ErrNoBucket = errors.New("the inventory bucket does not exist yet; the planner creates it")

// KV returns the bucket, creating it if it is missing and the store may
// (NoCreate unset); for reads the store does not wrap (history, keys).
func (s *InventoryStore) KV(ctx context.Context) (jetstream.KeyValue, error) {
	if kv := s.kv.Load(); kv != nil {
		return *kv, nil
	}
	kv, err := bindKV(ctx, s.js, client.InventoryBucket, s.NoCreate, ErrNoBucket, s.Ensure)
	if err == nil {
		s.kv.Store(&kv)
	}
	return kv, err
}

// bindKV binds bucket first (a client may write a bucket it may not make
// or change); a bucket not there is missing where the store may not
// create it (a reader leaves the server as it found it), else ensure's.
func bindKV(ctx context.Context, js jetstream.JetStream, bucket string, noCreate bool, missing error,
	ensure func(context.Context) (jetstream.KeyValue, error)) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	switch {
	case err == nil:
		return kv, nil
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	case noCreate:
		return nil, missing
	}
	return ensure(ctx)
}

// ensureKV makes bucket cfg, or brings it to cfg's settings, the way
// bus.CreateOrUpdate does a stream: an update only where the bucket
// differs.
func ensureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return bus.CreateOrUpdate(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) },
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.UpdateKeyValue(ctx, cfg) })
}

// ensureObjectStore is ensureKV for an object store.
func ensureObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	return bus.CreateOrUpdate(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) { return js.CreateObjectStore(ctx, cfg) },
		func(ctx context.Context) (jetstream.ObjectStore, error) { return js.UpdateObjectStore(ctx, cfg) })
}

// Put stores doc (a NodeInventory as JSON) under nodeID with a TTL. A
// heartbeat put must carry the same bytes as the last change; it is
// marked with HeartbeatHeader so that watchers can skip it without
// reading the value. It returns the revision.
func (s *InventoryStore) Put(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration) (uint64, error) {
	return s.put(ctx, nodeID, doc, heartbeat, ttl, nil)
}

// ErrKeyMoved is PutIf's and DeleteIf's answer when the key changed
// since the revision the writer expected: something else wrote it.
var ErrKeyMoved = errors.New("the key changed since this writer's last revision")

// PutIf is Put, done only if nodeID's key is still at revision last (0:
// it holds nothing); else ErrKeyMoved. A reporter writes this way, so
// that two reporters given one node id notice each other.
func (s *InventoryStore) PutIf(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration, last uint64) (uint64, error) {
	return s.put(ctx, nodeID, doc, heartbeat, ttl, &last)
}

func (s *InventoryStore) put(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration, last *uint64) (uint64, error) {
	if err := inventory.ValidateNodeID(nodeID); err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: bus.InventorySubject(nodeID), Header: nats.Header{}, Data: doc}
	if heartbeat {
		msg.Header.Set(bus.HeartbeatHeader, "1")
	}
	rev, err := s.publish(ctx, msg, ttl, last)
	if err != nil {
		return 0, fmt.Errorf("put inventory %s: %w", nodeID, err)
	}
	return rev, nil
}

// publish writes msg to the bucket with a TTL (and the expected last
// revision, when last is set).
func (s *InventoryStore) publish(ctx context.Context, msg *nats.Msg, ttl time.Duration, last *uint64) (uint64, error) {
	if _, err := s.KV(ctx); err != nil {
		return 0, err
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(bus.KeyTTL(ttl))}
	if last != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*last))
	}
	ack, err := s.js.PublishMsg(ctx, msg, opts...)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		// The bucket vanished under us (a server restarted without its
		// storage): make it again and retry once.
		s.kv.Store(nil)
		if _, err = s.KV(ctx); err == nil {
			ack, err = s.js.PublishMsg(ctx, msg, opts...)
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return 0, ErrKeyMoved
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// Delete removes nodeID's key: watchers see a KV delete. The delete
// marker itself expires after ttl, so a bucket whose nodes come and go
// does not fill with markers.
func (s *InventoryStore) Delete(ctx context.Context, nodeID string, ttl time.Duration) error {
	return s.delete(ctx, nodeID, ttl, nil)
}

// DeleteIf is Delete, done only if the key is still at revision last;
// else ErrKeyMoved: a reporter shutting down does not delete a key
// another reporter now holds.
func (s *InventoryStore) DeleteIf(ctx context.Context, nodeID string, ttl time.Duration, last uint64) error {
	return s.delete(ctx, nodeID, ttl, &last)
}

func (s *InventoryStore) delete(ctx context.Context, nodeID string, ttl time.Duration, last *uint64) error {
	_, err := s.marker(ctx, nodeID, ttl, last, nil)
	return err
}

// Tombstone writes the delete marker of nodeID's key whose TTL ran out,
// marked with ExpiredHeader (seen: the key's last revision the writer
// saw, for people), only if the key still holds nothing: the expected
// last sequence of its subject is 0, which is what the writer saw when
// it found the key expired. A reporter that put the key again since
// keeps it (ErrKeyMoved), and so does a marker written since (another
// planner's, the reporter's delete). The marker expires after ttl. It
// returns the marker's revision.
func (s *InventoryStore) Tombstone(ctx context.Context, nodeID string, ttl time.Duration, seen uint64) (uint64, error) {
	none := uint64(0)
	return s.marker(ctx, nodeID, ttl, &none, nats.Header{bus.ExpiredHeader: []string{strconv.FormatUint(seen, 10)}})
}

func (s *InventoryStore) marker(ctx context.Context, nodeID string, ttl time.Duration, last *uint64, h nats.Header) (uint64, error) {
	if err := inventory.ValidateNodeID(nodeID); err != nil {
		return 0, err
	}
	// jetstream.KeyValue.Delete refuses a TTL, so write the marker as KV
	// does (KV-Operation: DEL) with our own TTL.
	msg := nats.NewMsg(bus.InventorySubject(nodeID))
	for k, v := range h {
		msg.Header[k] = v
	}
	msg.Header.Set("KV-Operation", "DEL")
	rev, err := s.publish(ctx, msg, ttl, last)
	if err != nil {
		return 0, fmt.Errorf("delete inventory %s: %w", nodeID, err)
	}
	return rev, nil
}

// Current is nodeID's key as it stands: the document (nil when it was
// deleted) and the revision (0 when the key holds nothing).
func (s *InventoryStore) Current(ctx context.Context, nodeID string) ([]byte, uint64, error) {
	st, err := s.State(ctx, nodeID)
	return st.Doc, st.Revision, err
}

// KeyState is a key as it stands, as a writer deciding whether to claim
// it reads it.
type KeyState struct {
	// Doc is the document; nil when the key was deleted or holds nothing.
	Doc []byte
	// Revision is the key's last revision; 0 when it holds nothing.
	Revision uint64
	// Expires is when the last revision expires by its Nats-TTL (the
	// server's time of the write plus the TTL); zero without one.
	Expires time.Time
}

// State is nodeID's key as it stands (Current, with the expiry of its
// last write).
func (s *InventoryStore) State(ctx context.Context, nodeID string) (KeyState, error) {
	if err := inventory.ValidateNodeID(nodeID); err != nil {
		return KeyState{}, err
	}
	if _, err := s.KV(ctx); err != nil {
		return KeyState{}, fmt.Errorf("read inventory %s: %w", nodeID, err)
	}
	st, err := s.js.Stream(ctx, bus.InventoryStream)
	if err != nil {
		return KeyState{}, fmt.Errorf("read inventory %s: %w", nodeID, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.InventorySubject(nodeID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return KeyState{}, nil
	}
	if err != nil {
		return KeyState{}, fmt.Errorf("read inventory %s: %w", nodeID, err)
	}
	k := KeyState{Revision: m.Sequence}
	if ttl := msgTTL(m.Header); ttl > 0 {
		k.Expires = m.Time.Add(ttl)
	}
	if removal(m.Header) == "" {
		k.Doc = m.Data
	}
	return k, nil
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
	if err := inventory.DecodeShared(e.Value(), &inv, s.shared); err != nil {
		return inventory.NodeInventory{}, 0, fmt.Errorf("get inventory %s: revision %d: %w", nodeID, e.Revision(), err)
	}
	return inv, e.Revision(), nil
}

// listWindow is how many of List's reads are in flight at once.
const listWindow = 64

// List returns the inventories of all reporting nodes, by node id. The
// keys come from the stream's subjects and each value from a direct get,
// not from a consumer: clients may make no consumer on the inventory
// (auth's plannerOnlyConsumers), and a listing must not take a slot of
// the stream's consumer cap from the planner's watch. The reads run
// listWindow at a time, so 20,000 nodes cost one pass of round trips
// rather than one after another (which took longer than planner status
// gives the inventory).
func (s *InventoryStore) List(ctx context.Context) ([]inventory.NodeInventory, error) {
	if _, err := s.KV(ctx); err != nil {
		return nil, fmt.Errorf("list inventory: %w", err)
	}
	ids, err := bucketKeys(ctx, s.js, client.InventoryBucket)
	if err != nil {
		return nil, fmt.Errorf("list inventory: %w", err)
	}
	out, err := s.listBatched(ctx, ids)
	if !errors.Is(err, errNoMultiLast) {
		return out, err
	}
	return s.listEach(ctx, ids)
}

// listBatched is List in batched direct gets (lastValues), all as of
// one stream sequence.
func (s *InventoryStore) listBatched(ctx context.Context, ids []string) ([]inventory.NodeInventory, error) {
	byID, err := bucketValues(ctx, s.js, client.InventoryBucket, bus.InventoryStream, ids)
	if err != nil {
		return nil, fmt.Errorf("list inventory: %w", err)
	}
	out := make([]inventory.NodeInventory, 0, len(byID))
	for _, id := range ids {
		v, ok := byID[id]
		if !ok {
			continue
		}
		var inv inventory.NodeInventory
		if err := inventory.DecodeShared(v.Data, &inv, s.shared); err != nil {
			return nil, fmt.Errorf("list inventory: %s: get inventory %s: revision %d: %w", id, id, v.Seq, err)
		}
		out = append(out, inv)
	}
	return out, nil
}

// bucketValues is the value of each of keys of KV bucket (its stream
// stream) in batched direct gets (lastValues), all as of one stream
// sequence: a key deleted, expired or never put is left out.
// errNoMultiLast where the server does not batch.
func bucketValues(ctx context.Context, js jetstream.JetStream, bucket, stream string, keys []string) (map[string]*lastValue, error) {
	prefix := "$KV." + bucket + "."
	subjects := make([]string, len(keys))
	for i, k := range keys {
		subjects[i] = prefix + k
	}
	values, err := lastValues(ctx, js, apiPrefix(js), stream, subjects, 0, listWindow/16)
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]*lastValue, len(values))
	for i := range values {
		v := &values[i]
		switch v.Header.Get(kvOperationHeader) {
		case "DEL", "PURGE":
			continue // deleted or expired, as Get's ErrKeyNotFound
		}
		byKey[strings.TrimPrefix(v.Subject, prefix)] = v
	}
	return byKey, nil
}

// kvOperationHeader marks a KV bucket's delete and purge markers.
const kvOperationHeader = "KV-Operation"

// listEach is List key by key, for servers without batched direct gets.
func (s *InventoryStore) listEach(ctx context.Context, ids []string) ([]inventory.NodeInventory, error) {
	docs := make([]inventory.NodeInventory, len(ids))
	have := make([]bool, len(ids))
	errs := make([]error, len(ids))
	slots := make(chan struct{}, listWindow)
	var wg sync.WaitGroup
	for i, id := range ids {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nil, fmt.Errorf("list inventory: %w", ctx.Err())
		}
		wg.Go(func() {
			defer func() { <-slots }()
			inv, _, err := s.Get(ctx, id)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				// expired or deleted between listing and reading
			case err != nil:
				errs[i] = err
			default:
				docs[i], have[i] = inv, true
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("list inventory: %s: %w", ids[i], err)
		}
	}
	out := make([]inventory.NodeInventory, 0, len(ids))
	for i := range ids {
		if have[i] {
			out = append(out, docs[i])
		}
	}
	return out, nil
}

// bucketKeys are the keys kv's stream holds a message of, deleted ones
// too (a Get tells them apart), sorted. From the stream's subjects, not
// a consumer as kv.ListKeys makes: clients may make no consumer on the
// buckets the planner watches (auth's plannerOnlyConsumers), and a
// listing must not take a slot of the stream's consumer cap from the
// planner's watch either.
func bucketKeys(ctx context.Context, js jetstream.JetStream, bucket string) ([]string, error) {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + bucket + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subject, prefix))
	}
	slices.Sort(keys)
	return keys, nil
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
	// Rejected: the key's new document cannot be trusted (not JSON, a
	// node_id other than the key, impossible values); Event.Reason says
	// why. The node is out until a valid document comes; its heartbeats
	// are not read again.
	Rejected
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
	case Rejected:
		return "rejected"
	}
	return "EventOp(" + strconv.Itoa(int(o)) + ")"
}

// Removal reasons.
const (
	ReasonDeleted = "deleted" // the reporter shut down and deleted its key
	ReasonExpired = "expired" // the key's TTL ran out: the reporter died
	ReasonPurged  = "purged"  // an operator purged the key
)

// Rejection is the kind of fault that got a document Rejected: a few
// fixed kinds, for metrics (Event.Reason is the whole text).
type Rejection int

// The kinds of rejection.
const (
	// RejectUnparsable: the document is not JSON of an inventory.
	RejectUnparsable Rejection = iota + 1
	// RejectInvalid: impossible values (inventory.Validate).
	RejectInvalid
	// RejectKeyMismatch: a node_id other than its key.
	RejectKeyMismatch
)

func (r Rejection) String() string {
	switch r {
	case RejectUnparsable:
		return "unparsable"
	case RejectInvalid:
		return "invalid"
	case RejectKeyMismatch:
		return "key_mismatch"
	}
	return "unknown"
}

// Event is one change to the inventory bucket as a watcher sees it.
type Event struct {
	Op       EventOp
	NodeID   string
	Revision uint64
	// Inventory is set for Changed.
	Inventory inventory.NodeInventory
	// Reason is set for Removed, and for Rejected (the fault's text).
	Reason string
	// Rejection is set for Rejected: the fault's kind.
	Rejection Rejection
	// ExpiresAt is when the key will vanish unless refreshed, for Changed
	// and Heartbeat; zero if the put carried no TTL.
	ExpiresAt time.Time
	// TTL is the key's TTL as its last put set it, for Changed,
	// Heartbeat and a Removed that the watch noticed itself (zero: none,
	// or not known).
	TTL time.Duration
	// Marker, on Removed, says that a message in the stream removed the
	// key (a delete marker, a purge, a planner's Tombstone); without it
	// the watch noticed the key's TTL ran out, and nothing in the stream
	// says so yet. Revision is then the key's last revision the watch
	// saw.
	Marker bool
}

// LastRevision is the bucket's last revision: the sequence of the last
// message its stream took (0: none). A watch that has delivered an event
// of that revision or later has delivered everything the bucket held
// when it was asked.
func (s *InventoryStore) LastRevision(ctx context.Context) (uint64, error) {
	if _, err := s.KV(ctx); err != nil {
		return 0, fmt.Errorf("read the inventory bucket's last revision: %w", err)
	}
	// Binding the stream reads its info from the leader: one request.
	st, err := s.js.Stream(ctx, bus.InventoryStream)
	if err != nil {
		return 0, fmt.Errorf("read the inventory bucket's last revision: %w", err)
	}
	return st.CachedInfo().State.LastSeq, nil
}

// Watch follows the bucket: first the latest state of every key, then a
// Synced event, then every change. It reads headers only and fetches a
// value only for a change, so a heartbeat costs a watcher about 200 bytes
// whatever the size of the inventory. The channel is closed when ctx is
// done or the watch fails.
//
// A key whose TTL runs out leaves no marker (the bucket refuses rollups,
// which markers need): the watch itself notes when each key expires,
// and once that time has passed and the server no longer holds the key,
// it delivers Removed with ReasonExpired. So an expiry is never missed,
// not even one during a reconnect. The watch resumes by itself after a
// reconnect.
func (s *InventoryStore) Watch(ctx context.Context) (<-chan Event, error) {
	if _, err := s.KV(ctx); err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	cons, err := s.js.OrderedConsumer(ctx, bus.InventoryStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.InventorySubjectPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	it, err := cons.Messages(wire.FollowHeartbeat()...)
	if err != nil {
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	out := make(chan Event, 64)
	ended := bus.StopOnDone(ctx, it.Stop)
	var initial uint64
	if info := cons.CachedInfo(); info != nil {
		initial = info.NumPending
	}
	msgs := readAhead(ctx, s, pump(ctx, it), initial)
	go func() {
		defer close(out)
		defer close(ended)
		w := watcher{store: s, known: map[string]bool{}, rejected: map[string]bool{}, expires: map[string]time.Time{},
			ttls: map[string]time.Duration{}, revs: map[string]uint64{}}
		w.run(ctx, msgs, initial, out)
	}()
	return out, nil
}

// pump hands the consumer's messages over a channel, closed when the
// iterator stops (or the consumer could not be recreated) or ctx ends.
func pump(ctx context.Context, it jetstream.MessagesContext) <-chan jetstream.Msg {
	msgs := make(chan jetstream.Msg, 64)
	go func() {
		defer close(msgs)
		for {
			msg, err := it.Next()
			if err != nil {
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return msgs
}

// run turns msgs into events on out until either ends: first the
// initial state (the initial messages pending when the consumer was
// made, one per key), then Synced, then every change, and the keys whose
// TTL ran out, checked every expiryCheck.
func (w *watcher) run(ctx context.Context, msgs <-chan delivery, initial uint64, out chan<- Event) {
	// Later puts may already be pending by the first delivery, so count
	// rather than wait for NumPending 0.
	synced := initial == 0
	if synced && !send(ctx, out, Event{Op: Synced}) {
		return
	}
	tick := time.NewTicker(expiryCheck)
	defer tick.Stop()
	var delivered uint64
	for {
		var msg delivery
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, ev := range w.expired(ctx, time.Now()) {
				if !send(ctx, out, ev) {
					return
				}
			}
			continue
		case m, ok := <-msgs:
			if !ok {
				return
			}
			msg = m
		}
		ev, ok := w.event(ctx, msg.msg, msg.pre)
		if ok && !send(ctx, out, ev) {
			return
		}
		delivered++
		if md, err := msg.msg.Metadata(); !synced && (delivered >= initial || err == nil && md.NumPending == 0) {
			synced = true
			if !send(ctx, out, Event{Op: Synced}) {
				return
			}
		}
	}
}

func send(ctx context.Context, out chan<- Event, ev Event) bool {
	select {
	case out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// expiryCheck is how often a watch looks for keys past their TTL.
const expiryCheck = 250 * time.Millisecond

type watcher struct {
	store *InventoryStore
	// known holds the keys whose current inventory this watcher has
	// delivered; a heartbeat for any other key needs its value read.
	known map[string]bool
	// rejected holds the keys whose current document was rejected: their
	// heartbeats (the same bytes) are not read again.
	rejected map[string]bool
	// expires is when each live key's TTL runs out, by this host's
	// clock: when its last message arrived plus the TTL. (The server's
	// timestamps are by its clock, which may differ from this one.)
	expires map[string]time.Time
	// ttls and revs are each live key's TTL and last revision, for the
	// Removed event of its expiry.
	ttls map[string]time.Duration
	revs map[string]uint64
}

// expiryChecksPerTick bounds the keys expired asks the server about at
// once, so that a burst (a rack losing power) does not hold up the watch.
const expiryChecksPerTick = 64

// expired delivers Removed for each key past its TTL that the server no
// longer holds. The server's word decides: a key this host thinks expired
// but the server still holds stays, and is asked again a second later.
func (w *watcher) expired(ctx context.Context, now time.Time) []Event {
	var out []Event
	asked := 0
	for node, at := range w.expires {
		if now.Before(at) {
			continue
		}
		if asked++; asked > expiryChecksPerTick {
			break
		}
		kv, err := w.store.KV(ctx)
		if err != nil {
			return out
		}
		_, err = kv.Get(ctx, node)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			ev := Event{Op: Removed, NodeID: node, Reason: ReasonExpired, Revision: w.revs[node], TTL: w.ttls[node]}
			w.forget(node)
			out = append(out, ev)
		case err == nil:
			w.expires[node] = now.Add(time.Second) // not yet, by the server's clock
		default:
			return out // NATS away: ask again next time
		}
	}
	return out
}

// event turns a headers-only message into an Event; false means skip it.
func (w *watcher) event(ctx context.Context, msg jetstream.Msg, pre <-chan fetched) (Event, bool) {
	nodeID, ok := strings.CutPrefix(msg.Subject(), bus.InventorySubjectPrefix)
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
		w.forget(nodeID)
		ev.Op, ev.Reason, ev.Marker = Removed, reason, true
		return ev, true
	}
	ttl := msgTTL(h)
	w.revs[nodeID], ev.TTL = ev.Revision, ttl
	if ttl == 0 {
		delete(w.expires, nodeID)
		delete(w.ttls, nodeID)
	} else {
		ev.ExpiresAt = md.Timestamp.Add(ttl)
		w.expires[nodeID] = time.Now().Add(ttl)
		w.ttls[nodeID] = ttl
	}
	if h.Get(bus.HeartbeatHeader) != "" && (w.known[nodeID] || w.rejected[nodeID]) {
		if w.rejected[nodeID] {
			return Event{}, false
		}
		ev.Op = Heartbeat
		return ev, true
	}
	// A value that cannot be read (expired or superseded since it was
	// delivered, NATS away) is skipped and the key forgotten: the next
	// heartbeat reads it again, instead of passing for "unchanged" and
	// hiding a change for ever.
	var f fetched
	if pre != nil {
		select {
		case f = <-pre:
		case <-ctx.Done():
			return Event{}, false
		}
	} else {
		f = fetch(ctx, w.store, msg)
	}
	if f.err != nil {
		delete(w.known, nodeID)
		return Event{}, false
	}
	// The key is the node's identity: a document must say it is that
	// node, and be possible, or the node is out.
	kind := RejectUnparsable
	ev.Inventory, err = f.inv, f.decodeErr
	if err == nil {
		kind, err = RejectInvalid, ev.Inventory.Validate()
	}
	if err == nil && ev.Inventory.NodeID != nodeID {
		kind, err = RejectKeyMismatch, fmt.Errorf("node_id: %q under key %q; a document must be the key's node", ev.Inventory.NodeID, nodeID)
	}
	if err != nil {
		delete(w.known, nodeID)
		w.rejected[nodeID] = true
		return Event{Op: Rejected, NodeID: nodeID, Revision: ev.Revision, Reason: err.Error(), Rejection: kind, ExpiresAt: ev.ExpiresAt, TTL: ev.TTL}, true
	}
	delete(w.rejected, nodeID)
	w.known[nodeID] = true
	ev.Op = Changed
	return ev, true
}

// forget drops what the watcher knows of a key that is gone.
func (w *watcher) forget(nodeID string) {
	delete(w.known, nodeID)
	delete(w.rejected, nodeID)
	delete(w.expires, nodeID)
	delete(w.ttls, nodeID)
	delete(w.revs, nodeID)
}

// msgTTL is a message's TTL; zero without one.
func msgTTL(h nats.Header) time.Duration {
	ttl := h.Get(jetstream.MsgTTLHeader)
	if ttl == "" || ttl == "never" {
		return 0
	}
	if secs, err := strconv.ParseInt(ttl, 10, 64); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if d, err := time.ParseDuration(ttl); err == nil && d > 0 {
		return d
	}
	return 0
}

// removal returns why a message removes its key, or "" for a put.
func removal(h nats.Header) string {
	switch h.Get("KV-Operation") {
	case "DEL":
		if h.Get(bus.ExpiredHeader) != "" {
			return ReasonExpired // a planner's Tombstone
		}
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
