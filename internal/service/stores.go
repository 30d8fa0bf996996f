package service

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// The service reaches JetStream's state only through the interfaces
// below (its request endpoints alone are served on the connection
// itself, bus.AddService), each the methods it calls of one store and no
// more, so that a test of the loop's behaviour (not of the wire) can run
// it on an in-memory store that keeps the same promises: a stream's
// sequence numbers, a publish fenced by the subject's last sequence, a
// watch delivering in the order written, a bucket's revisions and its
// delete markers.

// planStore is what the service needs of the plan stream, its snapshot
// object store and the lease (store.PlanStore, through jsPlans).
type planStore interface {
	// Publisher is this planner instance's name, sent with every
	// revision it publishes and held in the lease it takes.
	Publisher() string
	Ensure(ctx context.Context) error
	Latest(ctx context.Context, name string) (*store.StoredPlan, error)
	Revision(ctx context.Context, name string, rev int) (*store.StoredPlan, error)
	// PublishEvent is refused (store.ErrConflict) unless plan ev.Name's
	// last event is at sequence expect (0: none) or, with a lease
	// (nonzero), unless the lease's last write is still at lease
	// (bus.ErrLeaseLost); a second event of one revision is refused too.
	PublishEvent(ctx context.Context, ev *plan.Event, specDigest string, expect, lease uint64) (uint64, error)
	// PublishEventFor is PublishEvent carrying both digests.
	PublishEventFor(ctx context.Context, ev *plan.Event, d store.Digests, expect, lease uint64) (uint64, error)
	PutSnapshot(ctx context.Context, doc *plan.Document) (name string, size int, err error)
	DropSnapshot(ctx context.Context, name string)
	// PutSummary stores a snapshot revision's summary, for the readers
	// that list plans (client.Summary).
	PutSummary(ctx context.Context, sum *plan.Summary) error
	// PublishAssignments keeps nothing of as once it returns: the caller
	// writes the next assignments into their worker lists.
	PublishAssignments(ctx context.Context, as []client.Assignment, expect bool) (refused int, err error)
	// Assignments and Assignment read the assignment stream back, as a
	// launcher would.
	Assignments(ctx context.Context, name string, fn func(*client.Assignment) bool) error
	Assignment(ctx context.Context, name, node string) (*client.Assignment, error)
	Follow(ctx context.Context, name string, skip func(client.Info) bool) (<-chan *store.StoredPlan, error)
	Retain(ctx context.Context, name string, maxAge time.Duration, maxBytes int64, now time.Time) error
	LastEvent(ctx context.Context, subject string) (store.LastMessage, error)
	ReadLease(ctx context.Context, name string) (*bus.Lease, error)
	// WriteLease is refused unless the lease's last write is at expect
	// (0: none).
	WriteLease(ctx context.Context, name string, l *bus.Lease, expect uint64) (uint64, error)
	ReleaseLease(ctx context.Context, name string, seq uint64) error
}

// specStore is what the service needs of the spec bucket.
type specStore interface {
	Ensure(ctx context.Context) (kvBucket, error)
	// Bucket binds the bucket, making it where it is missing.
	Bucket(ctx context.Context) (kvBucket, error)
	Put(ctx context.Context, name string, spec []byte) (uint64, error)
	Entry(ctx context.Context, name string) (store.StoredSpec, error)
	Records(ctx context.Context) (*store.SpecRecords, error)
}

// inventoryStore is what the service needs of the inventory bucket.
type inventoryStore interface {
	Ensure(ctx context.Context) (kvBucket, error)
	// Watch delivers every node's latest document, then store.Synced,
	// then every change in the order the bucket took them.
	Watch(ctx context.Context) (<-chan store.Event, error)
	// Tombstone removes node nodeID unless it was written since
	// revision seen.
	Tombstone(ctx context.Context, nodeID string, ttl time.Duration, seen uint64) (uint64, error)
	// LastRevision is the bucket's last revision (0: none): a watch that
	// delivered an event of it or later delivered all the bucket held.
	LastRevision(ctx context.Context) (uint64, error)
}

// drainStore is what the service needs of the drain bucket. Only Ensure
// makes the bucket: a bucket lost since start is the loop's to make
// again with every drain it knows (restoreDrains), and one that Bucket
// or Put made would lack them.
type drainStore interface {
	Ensure(ctx context.Context) (kvBucket, error)
	// Bucket binds the bucket; store.ErrNoDrainBucket where it is missing.
	Bucket(ctx context.Context) (kvBucket, error)
	// Put stores d; store.ErrNoDrainBucket where the bucket is missing.
	Put(ctx context.Context, d store.Drain) error
}

// kvBucket is what the service does with a KV bucket itself (the spec
// and drain buckets): watch it, read a key's history, create a key not
// there (jetstream.ErrKeyExists where it is).
type kvBucket interface {
	WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
	History(ctx context.Context, key string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
}

// The stores on JetStream.
var (
	_ planStore      = jsPlans{}
	_ specStore      = jsSpecs{}
	_ inventoryStore = jsInventory{}
	_ drainStore     = jsDrains{}
	_ kvBucket       = jetstream.KeyValue(nil)
)

// jsPlans is store.PlanStore as a planStore.
type jsPlans struct{ *store.PlanStore }

func (s jsPlans) Publisher() string { return s.PlanStore.Publisher }

func (s jsPlans) Assignments(ctx context.Context, name string, fn func(*client.Assignment) bool) error {
	return s.Client().Assignments(ctx, name, fn)
}

func (s jsPlans) Assignment(ctx context.Context, name, node string) (*client.Assignment, error) {
	return s.Client().Assignment(ctx, name, node)
}

// jsSpecs is store.SpecStore as a specStore.
type jsSpecs struct{ *store.SpecStore }

func (s jsSpecs) Ensure(ctx context.Context) (kvBucket, error) {
	return bucket(s.SpecStore.Ensure(ctx))
}

func (s jsSpecs) Bucket(ctx context.Context) (kvBucket, error) { return bucket(s.KV(ctx)) }

// jsInventory is store.InventoryStore as an inventoryStore.
type jsInventory struct{ *store.InventoryStore }

func (s jsInventory) Ensure(ctx context.Context) (kvBucket, error) {
	return bucket(s.InventoryStore.Ensure(ctx))
}

// jsDrains is the drain bucket on JetStream: ensure makes it, bind only
// binds.
// ownerStore is what the service needs of the GPU UUID owners bucket
// (store.OwnerStore, through jsOwners).
type ownerStore interface {
	// Ensure makes the bucket where it is missing.
	Ensure(ctx context.Context) error
	// Load reads every UUID's owner (a missing bucket is an error).
	Load(ctx context.Context) (map[string]string, error)
	// Add records uuids as node's (those its record lacks), made at now
	// if it has none; two writers add to a record rather than replace
	// each other's.
	Add(ctx context.Context, node string, uuids []string, now time.Time) error
}

type jsOwners struct{ s *store.OwnerStore }

func newJSOwners(js jetstream.JetStream, replicas int) jsOwners {
	s := store.NewOwnerStore(js)
	s.Replicas = replicas
	return jsOwners{s}
}

func (o jsOwners) Ensure(ctx context.Context) error {
	_, err := o.s.Ensure(ctx)
	return err
}

func (o jsOwners) Load(ctx context.Context) (map[string]string, error) { return o.s.Load(ctx) }

func (o jsOwners) Add(ctx context.Context, node string, uuids []string, now time.Time) error {
	return o.s.Add(ctx, node, uuids, now)
}

type jsDrains struct{ ensure, bind *store.DrainStore }

func newJSDrains(js jetstream.JetStream, replicas int) jsDrains {
	d := jsDrains{ensure: store.NewDrainStore(js), bind: store.NewDrainStore(js)}
	d.ensure.Replicas = replicas
	d.bind.NoCreate = true
	return d
}

func (s jsDrains) Ensure(ctx context.Context) (kvBucket, error) { return bucket(s.ensure.Ensure(ctx)) }
func (s jsDrains) Bucket(ctx context.Context) (kvBucket, error) { return bucket(s.bind.KV(ctx)) }
func (s jsDrains) Put(ctx context.Context, d store.Drain) error { return s.bind.Put(ctx, d) }

// bucket narrows a bound jetstream.KeyValue, keeping a failure's nil a
// nil interface.
func bucket(kv jetstream.KeyValue, err error) (kvBucket, error) {
	if err != nil {
		return nil, err
	}
	return kv, nil
}

// link is what the service needs of its NATS connection and of the state
// streams themselves, beside what the stores hold.
type link interface {
	// Reconnects counts the connection's reconnects so far.
	Reconnects() uint64
	Connected() bool
	// BodyLimit is the largest message body the server takes (less
	// room for headers).
	BodyLimit() int
	// Stream is state stream name as it stands;
	// jetstream.ErrStreamNotFound where it is missing.
	Stream(ctx context.Context, name string) (streamState, error)
}

// streamState is what the service reads of a state stream itself.
type streamState struct {
	LastSeq uint64
	// Msgs is how many messages it holds; Lost, how many the server
	// reports lost (a damaged store).
	Msgs, Lost uint64
	// Created is when the stream was made: a stream made anew since it
	// was last looked at began its sequences again.
	Created time.Time
}

// jsLink is the link over a NATS connection and its JetStream.
type jsLink struct {
	nc *nats.Conn
	js jetstream.JetStream
}

var _ link = jsLink{}

func (l jsLink) Reconnects() uint64 { return l.nc.Stats().Reconnects }
func (l jsLink) Connected() bool    { return l.nc.IsConnected() }
func (l jsLink) BodyLimit() int     { return bus.BodyLimit(l.nc) }

func (l jsLink) Stream(ctx context.Context, name string) (streamState, error) {
	st, err := l.js.Stream(ctx, name)
	if err != nil {
		return streamState{}, err
	}
	info := st.CachedInfo()
	out := streamState{LastSeq: info.State.LastSeq, Msgs: info.State.Msgs, Created: info.Created}
	if info.State.Lost != nil {
		out.Lost = uint64(len(info.State.Lost.Msgs))
	}
	return out, nil
}
