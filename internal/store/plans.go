// Package store is the service's JetStream stores, typed over the plan
// and inventory documents: the plan stream and its objects (revisions,
// snapshots, assignments, retention, the lease), the spec bucket, the
// inventory bucket and its watch, and the rule for the plan names that
// key them.
//
// It is persistence only. Answering requests (lookups, validation, the
// words of refusals, error kinds) is package api's; planning is package
// planner's, of which store names only the types it stores and their
// parsing (Plan, ParseSpec, NameRule): TestStoreIsPersistence in package
// lint keeps it so.
package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// ErrConflict is returned by PlanStore.PublishEvent when another planner
// published to the plan first: re-read the latest and recompute.
var ErrConflict = errors.New("plan history moved on")

// StoredPlan is a plan revision as the stream holds it.
type StoredPlan struct {
	Plan *planner.Plan
	// Meta is where its event sits in the stream (Seq, the value to
	// expect on the next publish), the chain it ends (Base), and its
	// spec's digest and publisher.
	client.Meta
	// Unreadable marks a revision that could not be read: no change may
	// build on it.
	Unreadable bool
	// BaseBytes and ChainBytes weigh what a reader fetches to rebuild it:
	// the base's whole form and the change events after it; zero when
	// unknown (a revision read back rather than published here).
	BaseBytes, ChainBytes int
	// Changed lists the nodes its event says changed, when it carries a
	// change; nil when it does not say (a whole event).
	Changed []string
	// Orphan marks a revision whose event the stream lost (the stream
	// was recreated): the next revision must be whole, and published
	// even if it places the same.
	Orphan bool
}

func storedOf(r *client.Revision) *StoredPlan {
	sp := &StoredPlan{Plan: &planner.Plan{Document: *r.Document}, Meta: r.Meta}
	if ch := r.Event.Change; ch != nil {
		sp.Changed = make([]string, len(ch.Nodes))
		for i, n := range ch.Nodes {
			sp.Changed[i] = n.NodeID
		}
	}
	return sp
}

// PlanStore writes plan revisions (events, snapshots, assignments) and
// reads them back through the client package.
type PlanStore struct {
	js     jetstream.JetStream
	client *client.Client
	// Publisher, when set, goes out in PlannerHeader with every event.
	Publisher string
	// Replicas is how many servers keep the streams and object stores (0:
	// one).
	Replicas int
	// RepliesBytes is the replies bucket's size, once Ensure made it:
	// RepliesMaxBytes, or less where the servers have less room.
	RepliesBytes int64
	// LeaseName, when set, names the lease every published revision is
	// checked against (the leading planner plans every plan under
	// bus.LeaseName); else each plan's own.
	LeaseName string
	// objs tracks the assignment objects of the plans bucket (nil until
	// first listed).
	objMu sync.Mutex
	objs  map[string]bool
	// bodies are assignment body buffers (*[]byte) a PublishAssignments
	// call left answered, for the next call: a first revision sends
	// 20,000 in batches, and buffers that went round only within a call
	// made a window's worth afresh each batch (67 MB at 20,000 nodes,
	// while the first revision's heap is at its largest).
	bodies sync.Pool
}

// NewPlanStore returns a store over js; Ensure creates the streams and
// buckets.
func NewPlanStore(js jetstream.JetStream) *PlanStore {
	c, _ := client.New(js.Conn()) // cannot fail: js already is one
	return &PlanStore{js: js, client: c}
}

// Client is the store's reading side.
func (s *PlanStore) Client() *client.Client { return s.client }

// Ensure creates the plan and assignment streams and the object stores if
// they are missing.
func (s *PlanStore) Ensure(ctx context.Context) error {
	r := max(s.Replicas, 1)
	for _, cfg := range []jetstream.StreamConfig{bus.PlansStreamConfig(r), bus.AssignmentsStreamConfig(r)} {
		if _, err := bus.CreateOrUpdate(ctx, func(ctx context.Context) (jetstream.Stream, error) { return s.js.CreateStream(ctx, cfg) },
			func(ctx context.Context) (jetstream.Stream, error) { return s.js.UpdateStream(ctx, cfg) }); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, bus.ReplicasErr(err, r))
		}
	}
	snapshots := jetstream.ObjectStoreConfig{Bucket: client.PlansBucket, Description: "poolplanner: plan snapshots, oversized assignments", Storage: jetstream.FileStorage, Replicas: r}
	if _, err := ensureObjectStore(ctx, s.js, snapshots); err != nil {
		return fmt.Errorf("ensure object store %s: %w", snapshots.Bucket, bus.ReplicasErr(err, r))
	}
	replies := jetstream.ObjectStoreConfig{Bucket: client.RepliesBucket, Description: "poolplanner: replies too large for a message", Storage: jetstream.FileStorage, TTL: bus.RepliesTTL, Replicas: r}
	for size := int64(bus.RepliesMaxBytes); ; size /= 2 {
		replies.MaxBytes = size
		_, err := ensureObjectStore(ctx, s.js, replies)
		if err == nil {
			s.RepliesBytes = size
			return nil
		}
		if !bus.IsInsufficient(err) || size/2 < bus.RepliesMinBytes {
			return fmt.Errorf("ensure object store %s: %w", replies.Bucket, bus.StorageErr(err, r, size))
		}
	}
}

// Latest returns the newest revision of plan name, rebuilt whole; nil and
// no error when the plan has none yet.
//
// A latest revision no one can read (damaged, or written by another
// program) must not stop planning: it comes back as an invalid plan of
// its revision, which the next plan follows as it would any invalid one.
func (s *PlanStore) Latest(ctx context.Context, name string) (*StoredPlan, error) {
	st, err := s.js.Stream(ctx, client.PlansStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest plan %s: %w", name, err)
	}
	// Read the last event once, and rebuild that one: a newer event
	// stored meanwhile must not be blamed for this one's damage.
	m, err := st.GetLastMsgForSubject(ctx, client.PlanEventSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest plan %s: %w", name, err)
	}
	rev, _ := strconv.Atoi(m.Header.Get(client.RevisionHeader))
	r, err := s.client.Plan(ctx, name, rev)
	switch {
	case rev < 1:
		err = fmt.Errorf("%w: no revision header", client.ErrUnreadable)
	case err == nil && r.Seq != m.Sequence:
		err = fmt.Errorf("%w: an earlier event also claims revision %d", client.ErrUnreadable, rev)
	}
	if errors.Is(err, client.ErrUnreadable) {
		doc := plan.Document{Header: plan.Header{Name: name, Revision: rev, Error: fmt.Sprintf("revision %d is unreadable: %v", rev, err)}}
		return &StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{Seq: m.Sequence, Base: rev}, Unreadable: true}, nil
	}
	if err != nil {
		return nil, err
	}
	return storedOf(r), nil
}

// Revision returns revision rev of plan name, rebuilt whole, or
// ErrNotFound.
func (s *PlanStore) Revision(ctx context.Context, name string, rev int) (*StoredPlan, error) {
	r, err := s.client.Plan(ctx, name, rev)
	if err != nil {
		return nil, err
	}
	return storedOf(r), nil
}

// PublishEvent appends ev as the next revision of its plan, only if the
// last event on the subject is still at sequence expect (0: none yet).
// The message id is NAME:REVISION, so a retried publish is stored once and
// a second planner's revision N is refused. It returns ErrConflict when
// the history moved on.
//
// With a lease (its sequence, nonzero) the stream checks that lease
// instead: it must still be the last message on the plan's lease subject,
// so a planner that lost its lease cannot publish; the one that holds it
// is the plan's only writer and continues from the latest it read when it
// took the lease. The message id (plan:revision) refuses a second event
// of one revision in the duplicate window either way.
func (s *PlanStore) PublishEvent(ctx context.Context, ev *plan.Event, specDigest string, expect, lease uint64) (uint64, error) {
	return s.PublishEventFor(ctx, ev, Digests{Spec: specDigest}, expect, lease)
}

// Digests are the digests a revision's event carries: of its spec
// (client.SpecDigestHeader), and, where that spec is pending, of the
// spec its placement follows (client.PlacedForHeader; empty: none); and
// the spec bucket revision of its spec (client.SpecRevisionHeader; 0:
// not known, no header).
type Digests struct {
	Spec, PlacedFor string
	SpecRevision    uint64
}

// PublishEventFor is PublishEvent with both digests.
func (s *PlanStore) PublishEventFor(ctx context.Context, ev *plan.Event, d Digests, expect, lease uint64) (uint64, error) {
	what := fmt.Sprintf("plan %s revision %d", ev.Name, ev.Revision)
	data, h, err := wire.Encode(ev)
	if err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	if err := bus.CheckPayload(s.js.Conn(), what, len(data)); err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	if h == nil {
		h = nats.Header{}
	}
	msg := &nats.Msg{Subject: client.PlanEventSubject(ev.Name), Header: h, Data: data}
	msg.Header.Set(client.RevisionHeader, strconv.Itoa(ev.Revision))
	msg.Header.Set(client.BaseHeader, strconv.Itoa(ev.Base))
	msg.Header.Set(client.KindHeader, ev.Kind())
	msg.Header.Set(client.ValidHeader, strconv.FormatBool(ev.Valid()))
	msg.Header.Set(client.StateHeader, string(ev.PlanState()))
	msg.Header.Set(client.MovedHeader, strconv.Itoa(ev.Moved))
	msg.Header.Set(client.ReasonHeader, oneLine(ev.Reason, 1024))
	if ev.Error != "" {
		msg.Header.Set(client.ErrorHeader, oneLine(ev.Error, 1024))
	}
	msg.Header.Set(client.SpecDigestHeader, d.Spec)
	if d.PlacedFor != "" {
		msg.Header.Set(client.PlacedForHeader, d.PlacedFor)
	}
	if d.SpecRevision != 0 {
		msg.Header.Set(client.SpecRevisionHeader, strconv.FormatUint(d.SpecRevision, 10))
	}
	if s.Publisher != "" {
		msg.Header.Set(client.PlannerHeader, s.Publisher)
	}
	check := jetstream.WithExpectLastSequencePerSubject(expect)
	if lease != 0 {
		check = jetstream.WithExpectLastSequenceForSubject(lease, bus.LeaseSubject(cmp.Or(s.LeaseName, ev.Name)))
	}
	ack, err := s.js.PublishMsg(ctx, msg, check, jetstream.WithMsgID(ev.Name+":"+strconv.Itoa(ev.Revision)))
	if bus.IsWrongLast(err) && lease != 0 {
		return 0, fmt.Errorf("publish %s: %w", what, bus.ErrLeaseLost)
	}
	if bus.IsWrongLast(err) {
		return 0, fmt.Errorf("publish %s: %w", what, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	if ack.Duplicate {
		// Someone stored this revision first, with other content.
		return 0, fmt.Errorf("publish %s: duplicate: %w", what, ErrConflict)
	}
	return ack.Sequence, nil
}

// oneLine makes s fit a header: one line, at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// PutSnapshot stores doc whole, gzipped JSON, as its revision's snapshot
// object, and returns the object's name.
func (s *PlanStore) PutSnapshot(ctx context.Context, doc *plan.Document) (name string, size int, err error) {
	name = wire.SnapshotObject(doc.Name, doc.Revision, nuid.Next())
	// Streamed: a large plan's JSON is never held whole.
	if size, err = bus.StoreStreamed(ctx, s.js, client.PlansBucket, name, doc.WriteJSON); err != nil {
		return "", 0, fmt.Errorf("snapshot of plan %s revision %d: %w", doc.Name, doc.Revision, err)
	}
	return name, size, nil
}

// DropSnapshot deletes a snapshot no event names (its revision was not
// published); the history's trimming would delete it later anyway.
func (s *PlanStore) DropSnapshot(ctx context.Context, name string) { s.dropObject(ctx, name) }

// putObject stores data gzipped; size is the bytes stored.
func (s *PlanStore) putObject(ctx context.Context, bucket, name string, data []byte) (int, error) {
	return bus.StoreObject(ctx, s.js, bucket, name, data)
}

// PublishAssignments publishes each node's workers on its assignment
// subject and waits for JetStream to store them. A node's workers too
// many for one message go into an object, which the message points at;
// once a node's new message is stored, its older objects are deleted.
// With expect, each assignment replaces only the message at its Seq (0:
// none yet): one published since is newer, and the server refuses this
// one, which is then dropped and counted in refused. Each stored
// assignment's Seq becomes its new stream sequence. At most assignmentWindow
// publishes wait for their acks at a time: far under the client's limit
// on pending async publishes, past which a publish gives up after a
// short stall on a busy server.
func (s *PlanStore) PublishAssignments(ctx context.Context, as []client.Assignment, expect bool) (refused int, err error) {
	acks := make([]jetstream.PubAckFuture, len(as))
	objects := make([]string, len(as))
	// Each body's buffer, free again once its publish is answered (a
	// publish is retried, until then, from its message): the window's
	// buffers go round rather than 20,000 of them made and dropped while
	// a first revision's heap is at its largest.
	bodies := make([][]byte, len(as))
	var free [][]byte
	defer func() {
		// What is answered goes to the next call; a body still awaiting
		// its answer (ctx or an error ended the call) is not reused.
		for _, b := range free {
			s.bodies.Put(&b)
		}
	}()
	// A body is free once its publish is answered, either way (nats.go
	// then keeps nothing of it to retry); never when the wait ends on
	// ctx, since the publish is still pending and may be sent again
	// (no responders: resent after a pause) from its message, which
	// reads the body.
	answered := func(i int) {
		if bodies[i] != nil {
			free, bodies[i] = append(free, bodies[i][:0]), nil
		}
	}
	wait := func(i int) error {
		select {
		case ack := <-acks[i].Ok():
			answered(i)
			as[i].Seq = ack.Sequence
			s.assignmentStored(ctx, &as[i], objects[i])
			return nil
		case err := <-acks[i].Err():
			answered(i)
			if expect && bus.IsWrongLast(err) {
				s.dropObject(ctx, objects[i])
				as[i].Seq = 0
				refused++
				return nil
			}
			return fmt.Errorf("assignment of %s: %w", as[i].NodeID, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i := range as {
		if i >= assignmentWindow {
			if err := wait(i - assignmentWindow); err != nil {
				return refused, err
			}
		}
		var buf []byte
		if n := len(free); n > 0 {
			buf, free = free[n-1], free[:n-1]
		} else if b, ok := s.bodies.Get().(*[]byte); ok {
			buf = (*b)[:0]
		}
		msg, object, raw, err := s.assignmentMsg(ctx, &as[i], buf)
		if err != nil {
			return refused, err
		}
		objects[i], bodies[i] = object, raw
		var opts []jetstream.PublishOpt
		if expect {
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(as[i].Seq))
		}
		if acks[i], err = s.js.PublishMsgAsync(msg, opts...); err != nil {
			return refused, fmt.Errorf("assignment of %s: %w", as[i].NodeID, err)
		}
	}
	for i := max(0, len(as)-assignmentWindow); i < len(as); i++ {
		if err := wait(i); err != nil {
			return refused, err
		}
	}
	return refused, nil
}

// assignmentWindow is how many assignment publishes may await their acks.
const assignmentWindow = 512

// assignmentMsg is a's message, the object that holds a when it is too
// large for one ("" when it is not), and a's JSON, written into buf's
// room (the caller's to reuse once the message is answered).
func (s *PlanStore) assignmentMsg(ctx context.Context, a *client.Assignment, buf []byte) (*nats.Msg, string, []byte, error) {
	// Without reflection: 20,000 of them at a first revision.
	raw, err := a.AppendJSON(buf)
	if err != nil {
		return nil, "", nil, err
	}
	data, h, err := wire.Encode(json.RawMessage(raw))
	if err != nil {
		return nil, "", nil, err
	}
	if h == nil {
		h = nats.Header{}
	}
	var object string
	if len(data) > bus.BodyLimit(s.js.Conn()) {
		object = wire.AssignmentObject(a.Plan, a.NodeID, nuid.Next())
		size, err := s.putObject(ctx, client.PlansBucket, object, raw)
		if err != nil {
			return nil, "", nil, fmt.Errorf("assignment of %s: %w", a.NodeID, err)
		}
		data, _ = json.Marshal(wire.ObjectRef{Bucket: client.PlansBucket, Object: object, Size: uint64(size)})
		h = nats.Header{wire.ObjectHeader: []string{"1"}}
	}
	h.Set(client.RevisionHeader, strconv.Itoa(a.Revision))
	return &nats.Msg{Subject: client.AssignmentSubject(a.Plan, a.NodeID), Header: h, Data: data}, object, raw, nil
}

// assignmentStored deletes a node's assignment objects other than the
// one its message, just stored, names (object; "" for none). The objects
// there are are listed once per store, then tracked.
func (s *PlanStore) assignmentStored(ctx context.Context, a *client.Assignment, object string) {
	prefix := wire.AssignmentObjectPrefix(a.Plan, a.NodeID)
	s.objMu.Lock()
	if s.objs == nil {
		s.objs = map[string]bool{}
		if obs, err := s.js.ObjectStore(ctx, client.PlansBucket); err == nil {
			if infos, err := obs.List(ctx); err == nil {
				for _, info := range infos {
					if strings.Contains(info.Name, "/assignments/") {
						s.objs[info.Name] = true
					}
				}
			}
		}
	}
	var old []string
	for name := range s.objs {
		if strings.HasPrefix(name, prefix) && name != object {
			old = append(old, name)
			delete(s.objs, name)
		}
	}
	if object != "" {
		s.objs[object] = true
	}
	s.objMu.Unlock()
	for _, name := range old {
		s.dropObject(ctx, name)
	}
}

// dropObject deletes object name of the plans bucket, if any.
func (s *PlanStore) dropObject(ctx context.Context, name string) {
	if name == "" {
		return
	}
	if obs, err := s.js.ObjectStore(ctx, client.PlansBucket); err == nil {
		_ = obs.Delete(context.WithoutCancel(ctx), name)
	}
}

// Follow delivers the latest revision of plan name and every new one
// that skip does not skip, until ctx is done: skip is asked about the
// latest too, on its headers, so that a planner that read it already
// does not read a large plan a second time while it starts. It follows the
// stream's republished headers, with no consumer: the planner's follow
// takes no slot a client could hold.
func (s *PlanStore) Follow(ctx context.Context, name string, skip func(client.Info) bool) (<-chan *StoredPlan, error) {
	ch, err := s.client.Follow(ctx, name, client.FollowOptions{Skip: skip, Republished: true, SkipLatest: true})
	if err != nil {
		return nil, err
	}
	out := make(chan *StoredPlan, 16)
	go func() {
		defer close(out)
		for r := range ch {
			select {
			case out <- storedOf(r):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// SpecStore reads and writes the spec bucket.
type SpecStore struct {
	js jetstream.JetStream
	// Replicas is how many servers keep the bucket (0: one).
	Replicas int
	// NoCreate keeps the store from creating the bucket: a read-only
	// command (spec get, spec ls) finding none gets ErrNoSpecBucket,
	// and leaves the server as it found it.
	NoCreate bool
}

// ErrNoSpecBucket is a store that may not create the spec bucket
// finding it missing: no planner ever ran against this server (or its
// account).
var ErrNoSpecBucket = errors.New("the spec bucket " + client.SpecBucket + " does not exist: no planner has run against this server (is planner serve connected to it?)")

// NewSpecStore returns a store over js.
func NewSpecStore(js jetstream.JetStream) *SpecStore { return &SpecStore{js: js} }

// KV creates the bucket if missing and returns it.
func (s *SpecStore) KV(ctx context.Context) (jetstream.KeyValue, error) {
	// Bind first: an admin may write specs but not make or change the
	// bucket, which the planner does.
	return bindKV(ctx, s.js, client.SpecBucket, s.NoCreate, ErrNoSpecBucket, s.Ensure)
}

// Ensure creates the spec bucket, or brings its settings (replicas) to
// SpecBucketConfig.
func (s *SpecStore) Ensure(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := ensureKV(ctx, s.js, bus.SpecBucketConfig(s.Replicas))
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", client.SpecBucket, bus.ReplicasErr(err, s.Replicas))
	}
	return kv, nil
}

// Put stores spec (YAML or JSON) as plan name's spec, after checking that
// it parses; it returns the key's revision.
func (s *SpecStore) Put(ctx context.Context, name string, spec []byte) (uint64, error) {
	if _, err := planner.ParseSpec(spec); err != nil {
		return 0, fmt.Errorf("%w: spec: %w", client.ErrBadRequest, err)
	}
	if err := ValidatePlanName(name); err != nil {
		return 0, err
	}
	kv, err := s.KV(ctx)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, name, spec)
	if err != nil {
		return 0, fmt.Errorf("put spec %s: %w", name, err)
	}
	return rev, nil
}

// Get returns plan name's current spec, or ErrNotFound.
func (s *SpecStore) Get(ctx context.Context, name string) ([]byte, uint64, error) {
	e, err := s.Entry(ctx, name)
	return e.Spec, e.Revision, err
}

// Entry returns plan name's current spec with its revision and when it
// was stored, or ErrNotFound.
func (s *SpecStore) Entry(ctx context.Context, name string) (StoredSpec, error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return StoredSpec{}, err
	}
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return StoredSpec{}, fmt.Errorf("spec %s: %w", name, client.ErrNotFound)
	}
	if err != nil {
		return StoredSpec{}, fmt.Errorf("get spec %s: %w", name, err)
	}
	return StoredSpec{Plan: name, Spec: e.Value(), Revision: e.Revision(), Updated: e.Created()}, nil
}

// Delete removes plan name's spec (its history stays): the planner
// releases the plan's workers and says so in its last revision. A plan
// with no spec is ErrNotFound; one whose record the server lists but
// cannot read (a damaged store, SpecRecords) is removed all the same.
func (s *SpecStore) Delete(ctx context.Context, name string) error {
	if err := ValidatePlanName(name); err != nil {
		return err
	}
	if _, _, err := s.Get(ctx, name); err != nil {
		recs, rerr := s.Records(ctx)
		if !errors.Is(err, client.ErrNotFound) || rerr != nil || !recs.Unreadable[name] {
			return err
		}
	}
	kv, err := s.KV(ctx)
	if err != nil {
		return err
	}
	if err := kv.Delete(ctx, name); err != nil {
		return fmt.Errorf("delete spec %s: %w", name, err)
	}
	return nil
}

// SpecRecords is what the spec bucket's stream says of its keys, as
// opposed to what a watch or a get of them delivers: a damaged store
// keeps a record in its index that no read returns (a flipped byte: the
// server's checksum refuses it, and a get says "not found" as for a key
// never stored), or loses one without a removal's marker.
type SpecRecords struct {
	// LastSeq is the bucket stream's last sequence: 0 for a bucket made
	// anew, which has lost nothing it can tell.
	LastSeq uint64
	// Keys are the keys with a record: a spec, or a removal's marker.
	Keys map[string]bool
	// Unreadable are the keys of Keys whose newest record the server
	// lists but cannot return.
	Unreadable map[string]bool
}

// Records reads the bucket stream's keys and tries each one's newest
// record: one request for the keys, one a key.
func (s *SpecStore) Records(ctx context.Context) (*SpecRecords, error) {
	st, err := s.js.Stream(ctx, "KV_"+client.SpecBucket)
	if err != nil {
		return nil, fmt.Errorf("spec bucket stream: %w", err)
	}
	prefix := "$KV." + client.SpecBucket + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("spec bucket's keys: %w", err)
	}
	out := &SpecRecords{LastSeq: info.State.LastSeq, Keys: map[string]bool{}, Unreadable: map[string]bool{}}
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, prefix)
		out.Keys[key] = true
		_, err := st.GetLastMsgForSubject(ctx, subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			out.Unreadable[key] = true
		case err != nil:
			return nil, fmt.Errorf("spec %s's record: %w", key, err)
		}
	}
	return out, nil
}

// StoredSpec is one plan's spec as the bucket holds it.
type StoredSpec struct {
	Plan     string
	Spec     []byte
	Revision uint64
	Updated  time.Time
}

// List returns every plan's current spec, by name.
func (s *SpecStore) List(ctx context.Context) ([]StoredSpec, error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := bucketKeys(ctx, s.js, client.SpecBucket)
	if err != nil {
		return nil, fmt.Errorf("list specs: %w", err)
	}
	var out []StoredSpec
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("get spec %s: %w", k, err)
		}
		out = append(out, StoredSpec{Plan: k, Spec: e.Value(), Revision: e.Revision(), Updated: e.Created()})
	}
	slices.SortFunc(out, func(a, b StoredSpec) int { return strings.Compare(a.Plan, b.Plan) })
	return out, nil
}

// PlanNameRule is a plan's name: 1 to 64 bytes of ASCII letters,
// digits and - _ =. A plan name is a token of subjects
// (poolplanner.plans.NAME, poolplanner.assignments.NAME.NODE_ID), the
// key of the spec bucket and the start of object names, so it has no
// dot, slash, wildcard or space; 64 bytes keeps every subject it makes
// far below the server's control-line limit (4 KB), whatever its node
// ids. A name breaking it is a bad request (400).
var PlanNameRule = planner.NameRule{Kind: "plan name", Max: 64, Punct: "-_=", Err: client.ErrBadRequest}

// ValidatePlanName checks name against PlanNameRule; its error is
// ErrBadRequest and names the length or the character that is wrong.
func ValidatePlanName(name string) error {
	return PlanNameRule.Check(name)
}
