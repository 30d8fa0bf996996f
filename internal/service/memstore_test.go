package service

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// memJS is an in-memory JetStream as the service uses it (stores.go):
// the plan stream (every plan's events and the lease, one sequence),
// its snapshot objects, the assignment stream and the spec, drain and
// inventory buckets. It keeps the promises the service builds on, which
// TestMemStoresAsJetStream checks against the real stores: a publish
// fenced by a subject's last sequence, a message id stored once, a
// lease that lapses by its TTL, revisions rebuilt from their change
// chain, watches that deliver what is there, then a marker, then every
// write in order, and delete markers. Time is its clock's, so a test on
// a hand-moved clock expires leases and keys when it says.
//
// One mutex guards it all: writers are the service's goroutines and the
// test's; watchers are woken by closing changed, which every write
// replaces.
type memJS struct {
	clock Clock

	mu      sync.Mutex
	changed chan struct{}
	// seq is the plan stream's last sequence; msgs its messages in
	// sequence order (events and leases), ids the message ids taken.
	seq     uint64
	msgs    []memMsg
	ids     map[string]bool
	objects map[string][]byte
	// aseq is the assignment stream's last sequence; assigns its
	// messages, by plan, then node: the last of each, as JSON.
	aseq    uint64
	assigns map[string]map[string]memAssignment
	specs   *memKV
	drains  *memKV
	// owners is the owners bucket: each node's GPU UUIDs.
	owners map[string][]string
	inv    *memKV
}

// memMsg is one message of the plan stream: an event (ev, with its
// spec digest and publisher) or a lease (lease).
type memMsg struct {
	seq     uint64
	subject string
	at      time.Time
	expires time.Time // zero: never
	// ev is the event as stored, for what it says of itself; data and
	// hdr, its encoding, which each read decodes afresh (fresh), as
	// the real stream's readers do: what one reader changes of its
	// document is no other's.
	ev           *plan.Event
	data         []byte
	hdr          nats.Header
	size         int
	specDigest   string
	placedFor    string
	specRevision uint64
	publisher    string
	lease        *bus.Lease
}

func newMemJS(clock Clock) *memJS {
	m := &memJS{clock: clock, changed: make(chan struct{}), ids: map[string]bool{}, objects: map[string][]byte{},
		assigns: map[string]map[string]memAssignment{}}
	m.specs = &memKV{js: m, bucket: client.SpecBucket, history: bus.SpecHistory, missing: store.ErrNoSpecBucket}
	m.drains = &memKV{js: m, bucket: client.DrainBucket, history: bus.DrainHistory, missing: store.ErrNoDrainBucket}
	m.inv = &memKV{js: m, bucket: client.InventoryBucket, history: 1, missing: store.ErrNoBucket}
	return m
}

// wrote wakes every watcher; m.mu is held.
func (m *memJS) wrote() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// live is the plan stream's messages on subject not lapsed, oldest
// first; m.mu is held.
func (m *memJS) live(subject string) []*memMsg {
	now := m.clock.Now()
	var out []*memMsg
	for i := range m.msgs {
		x := &m.msgs[i]
		if x.subject == subject && (x.expires.IsZero() || now.Before(x.expires)) {
			out = append(out, x)
		}
	}
	return out
}

// last is subject's last live message; nil if none. m.mu is held.
func (m *memJS) last(subject string) *memMsg {
	l := m.live(subject)
	if len(l) == 0 {
		return nil
	}
	return l[len(l)-1]
}

// plans is the plan store of planner publisher on m.
func (m *memJS) plans(publisher string) *memPlans { return &memPlans{js: m, publisher: publisher} }

// memPlans is memJS's plan stream as one planner's planStore.
type memPlans struct {
	js        *memJS
	publisher string
}

var (
	_ planStore      = (*memPlans)(nil)
	_ specStore      = memSpecs{}
	_ inventoryStore = memInventory{}
	_ drainStore     = memDrains{}
)

func (s *memPlans) Publisher() string                { return s.publisher }
func (s *memPlans) Ensure(ctx context.Context) error { return ctx.Err() }

func (s *memPlans) Latest(ctx context.Context, name string) (*store.StoredPlan, error) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	last := s.js.last(client.PlanEventSubject(name))
	if last == nil {
		return nil, ctx.Err()
	}
	sp, err := s.js.rebuild(name, last)
	if err != nil {
		doc := plan.Document{Header: plan.Header{Name: name, Revision: last.ev.Revision, Error: fmt.Sprintf("revision %d is unreadable: %v", last.ev.Revision, err)}}
		return &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{Seq: last.seq, Base: last.ev.Revision}, Unreadable: true}, nil
	}
	return sp, nil
}

func (s *memPlans) Revision(ctx context.Context, name string, rev int) (*store.StoredPlan, error) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	for _, x := range s.js.live(client.PlanEventSubject(name)) {
		if x.ev.Revision == rev {
			return s.js.rebuild(name, x)
		}
	}
	return nil, fmt.Errorf("plan %s revision %d: %w", name, rev, client.ErrNotFound)
}

// rebuild makes x's whole revision, as client.Plan does; m.mu is held.
func (m *memJS) rebuild(name string, x *memMsg) (*store.StoredPlan, error) {
	ev := x.ev
	sp := &store.StoredPlan{Meta: client.Meta{Seq: x.seq, SpecDigest: x.specDigest, PlacedFor: x.placedFor, SpecRevision: x.specRevision, Base: ev.Base, Publisher: x.publisher}}
	if ev.Kind() != "change" {
		doc, err := m.whole(x)
		if err != nil {
			return nil, err
		}
		sp.Plan = &planner.Plan{Document: *doc}
		return sp, nil
	}
	var chain []*memMsg
	var base *memMsg
	for _, y := range m.live(client.PlanEventSubject(name)) {
		switch {
		case y.ev.Revision == ev.Base && y.ev.Kind() != "change":
			base, chain = y, nil
		case base != nil && y.seq <= x.seq && y.ev.Base == ev.Base:
			chain = append(chain, y)
		}
	}
	if base == nil {
		return nil, fmt.Errorf("plan %s revision %d: %w: base %d gone", name, ev.Revision, client.ErrUnreadable, ev.Base)
	}
	doc, err := m.whole(base)
	if err != nil {
		return nil, err
	}
	r := plan.NewReplay(doc)
	for _, y := range chain {
		if y.ev.Revision != r.Revision()+1 {
			return nil, fmt.Errorf("plan %s revision %d: %w: the chain from base %d breaks at sequence %d", name, ev.Revision, client.ErrUnreadable, ev.Base, y.seq)
		}
		e, err := y.fresh()
		if err == nil {
			err = r.Apply(e)
		}
		if err != nil {
			return nil, fmt.Errorf("plan %s: %w: %w", name, client.ErrUnreadable, err)
		}
	}
	if r.Revision() != ev.Revision {
		return nil, fmt.Errorf("plan %s revision %d: %w: the chain from base %d ends at %d", name, ev.Revision, client.ErrUnreadable, ev.Base, r.Revision())
	}
	sp.Plan = &planner.Plan{Document: *r.Document()}
	return sp, nil
}

// fresh is x's event decoded anew.
func (x *memMsg) fresh() (*plan.Event, error) {
	var ev plan.Event
	if err := wire.Decode(x.data, x.hdr, &ev); err != nil {
		return nil, fmt.Errorf("event at sequence %d: %w: %w", x.seq, client.ErrUnreadable, err)
	}
	return &ev, nil
}

// whole is the document of x's event, which carries or names it whole;
// m.mu is held.
func (m *memJS) whole(x *memMsg) (*plan.Document, error) {
	ev, err := x.fresh()
	if err != nil {
		return nil, err
	}
	if ev.Placement != nil {
		return &plan.Document{Header: ev.Header, Placement: *ev.Placement}, nil
	}
	data, ok := m.objects[ev.Snapshot]
	if ev.Snapshot == "" || !ok {
		return nil, fmt.Errorf("revision %d: %w: snapshot %q gone", ev.Revision, client.ErrUnreadable, ev.Snapshot)
	}
	var d plan.Document
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("snapshot of revision %d: %w: %w", ev.Revision, client.ErrUnreadable, err)
	}
	return &d, nil
}

func (s *memPlans) PublishEvent(ctx context.Context, ev *plan.Event, specDigest string, expect, lease uint64) (uint64, error) {
	return s.PublishEventFor(ctx, ev, store.Digests{Spec: specDigest}, expect, lease)
}

func (s *memPlans) PublishEventFor(ctx context.Context, ev *plan.Event, d store.Digests, expect, lease uint64) (uint64, error) {
	what := fmt.Sprintf("plan %s revision %d", ev.Name, ev.Revision)
	// Through the wire's encoding, as the stream stores it: what the
	// caller changes after is not the stored event.
	data, h, err := wire.Encode(ev)
	if err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	var stored plan.Event
	if err := wire.Decode(data, h, &stored); err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("publish %s: %w", what, err)
	}
	m := s.js
	m.mu.Lock()
	defer m.mu.Unlock()
	subject := client.PlanEventSubject(ev.Name)
	if lease != 0 {
		if l := m.last(bus.LeaseSubject(bus.LeaseName)); l == nil || l.seq != lease {
			return 0, fmt.Errorf("publish %s: %w", what, bus.ErrLeaseLost)
		}
	} else if l := m.last(subject); (l == nil && expect != 0) || (l != nil && l.seq != expect) {
		return 0, fmt.Errorf("publish %s: %w", what, store.ErrConflict)
	}
	id := ev.Name + ":" + fmt.Sprint(ev.Revision)
	if m.ids[id] {
		return 0, fmt.Errorf("publish %s: duplicate: %w", what, store.ErrConflict)
	}
	m.ids[id] = true
	m.seq++
	m.msgs = append(m.msgs, memMsg{seq: m.seq, subject: subject, at: m.clock.Now(), ev: &stored, data: data, hdr: h, size: len(data),
		specDigest: d.Spec, placedFor: d.PlacedFor, specRevision: d.SpecRevision, publisher: s.publisher})
	m.wrote()
	return m.seq, nil
}

func (s *memPlans) PutSnapshot(ctx context.Context, doc *plan.Document) (string, int, error) {
	name := wire.SnapshotObject(doc.Name, doc.Revision, nuid.Next())
	data := doc.AppendJSON(nil)
	if err := ctx.Err(); err != nil {
		return "", 0, fmt.Errorf("snapshot of plan %s revision %d: %w", doc.Name, doc.Revision, err)
	}
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	s.js.objects[name] = data
	return name, len(data), nil
}

func (s *memPlans) PutSummary(ctx context.Context, sum *plan.Summary) error {
	data, err := json.Marshal(sum)
	if err != nil {
		return fmt.Errorf("summary of plan %s revision %d: %w", sum.Name, sum.Revision, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("summary of plan %s revision %d: %w", sum.Name, sum.Revision, err)
	}
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	s.js.objects[wire.SummaryObject(sum.Name)] = data
	return nil
}

func (s *memPlans) DropSnapshot(_ context.Context, name string) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	delete(s.js.objects, name)
}

func (s *memPlans) PublishAssignments(ctx context.Context, as []client.Assignment, expect bool) (int, error) {
	m := s.js
	m.mu.Lock()
	defer m.mu.Unlock()
	refused := 0
	for i := range as {
		if err := ctx.Err(); err != nil {
			return refused, err
		}
		a := &as[i]
		byNode := m.assigns[a.Plan]
		if byNode == nil {
			byNode = map[string]memAssignment{}
			m.assigns[a.Plan] = byNode
		}
		if expect && byNode[a.NodeID].seq != a.Seq {
			// One published since the Seq this one replaces is newer.
			a.Seq = 0
			refused++
			continue
		}
		data, err := json.Marshal(a)
		if err != nil {
			return refused, fmt.Errorf("assignment of %s: %w", a.NodeID, err)
		}
		m.aseq++
		a.Seq = m.aseq
		byNode[a.NodeID] = memAssignment{seq: a.Seq, data: data}
	}
	m.wrote()
	return refused, nil
}

// memAssignment is one assignment message: its sequence and its JSON,
// which each read decodes afresh.
type memAssignment struct {
	seq  uint64
	data []byte
}

func (x memAssignment) decode() (client.Assignment, error) {
	var a client.Assignment
	if err := json.Unmarshal(x.data, &a); err != nil {
		return a, fmt.Errorf("assignment at sequence %d: %w: %w", x.seq, client.ErrUnreadable, err)
	}
	a.Seq = x.seq
	return a, nil
}

func (s *memPlans) Assignments(ctx context.Context, name string, fn func(*client.Assignment) bool) error {
	s.js.mu.Lock()
	byNode := s.js.assigns[name]
	as := make([]client.Assignment, 0, len(byNode))
	for _, x := range byNode {
		a, err := x.decode()
		if err != nil {
			s.js.mu.Unlock()
			return err
		}
		as = append(as, a)
	}
	s.js.mu.Unlock()
	// In stream order, as a consumer reads them.
	slices.SortFunc(as, func(a, b client.Assignment) int { return cmp.Compare(a.Seq, b.Seq) })
	for i := range as {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !fn(&as[i]) {
			return nil
		}
	}
	return nil
}

func (s *memPlans) Assignment(ctx context.Context, name, node string) (*client.Assignment, error) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	x, ok := s.js.assigns[name][node]
	if !ok {
		return nil, fmt.Errorf("assignment of %s in plan %s: %w", node, name, client.ErrNotFound)
	}
	a, err := x.decode()
	if err != nil {
		return nil, err
	}
	return &a, ctx.Err()
}

// Follow delivers the latest revision and then every new one skip does
// not skip, each rebuilt, until ctx is done.
func (s *memPlans) Follow(ctx context.Context, name string, skip func(client.Info) bool) (<-chan *store.StoredPlan, error) {
	m := s.js
	subject := client.PlanEventSubject(name)
	m.mu.Lock()
	var from uint64
	var first *store.StoredPlan
	if last := m.last(subject); last != nil {
		from = last.seq
		first, _ = m.rebuild(name, last) // unreadable: follow what comes after it
	}
	m.mu.Unlock()
	out := make(chan *store.StoredPlan, 16)
	go func() {
		defer close(out)
		if first != nil && !memSend(ctx, out, first) {
			return
		}
		for {
			m.mu.Lock()
			var next []*store.StoredPlan
			for _, x := range m.live(subject) {
				if x.seq <= from {
					continue
				}
				from = x.seq
				if skip != nil && skip(infoOfMsg(x)) {
					continue
				}
				if sp, err := m.rebuild(name, x); err == nil {
					next = append(next, sp)
				}
			}
			wake := m.changed
			m.mu.Unlock()
			for _, sp := range next {
				if !memSend(ctx, out, sp) {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-wake:
			}
		}
	}()
	return out, nil
}

// infoOfMsg is x as a history lists it (client.Info).
func infoOfMsg(x *memMsg) client.Info {
	ev := x.ev
	return client.Info{Revision: ev.Revision, Meta: client.Meta{Seq: x.seq, Base: ev.Base, SpecDigest: x.specDigest, PlacedFor: x.placedFor, SpecRevision: x.specRevision, Publisher: x.publisher},
		Time: x.at, Valid: ev.Valid(), State: ev.PlanState(), Moved: ev.Moved, Reason: ev.Reason, Error: ev.Error, Kind: ev.Kind()}
}

// Retain drops plan name's oldest revisions past maxAge and, while the
// stream and its objects hold more than maxBytes, its oldest chains;
// only ever just before a whole revision, and never past the newest, so
// that what is kept can be rebuilt (store.PlanStore.Retain's rule).
func (s *memPlans) Retain(ctx context.Context, name string, maxAge time.Duration, maxBytes int64, now time.Time) error {
	m := s.js
	m.mu.Lock()
	defer m.mu.Unlock()
	subject := client.PlanEventSubject(name)
	// cutBefore drops name's events before the whole one at seq.
	cutBefore := func(seq uint64) {
		m.msgs = slices.DeleteFunc(m.msgs, func(x memMsg) bool { return x.subject == subject && x.seq < seq })
	}
	wholes := func() []uint64 {
		var out []uint64
		for _, x := range m.live(subject) {
			if x.ev.Kind() != "change" {
				out = append(out, x.seq)
			}
		}
		return out
	}
	if maxAge >= 0 {
		// What is kept starts at the newest whole revision older than
		// the cutoff: the base of the first one young enough.
		cutoff := now.Add(-maxAge)
		var keep uint64
		for _, x := range m.live(subject) {
			if !x.at.Before(cutoff) {
				break
			}
			if x.ev.Kind() != "change" {
				keep = x.seq
			}
		}
		cutBefore(keep)
	}
	size := func() (n int64) {
		for _, x := range m.msgs {
			n += int64(x.size)
		}
		for _, o := range m.objects {
			n += int64(len(o))
		}
		return n
	}
	for maxBytes >= 0 && size() > maxBytes {
		w := wholes()
		if len(w) < 2 {
			break
		}
		cutBefore(w[1])
	}
	// The snapshots no kept revision names go.
	named := map[string]bool{}
	for _, x := range m.msgs {
		if x.ev != nil && x.ev.Snapshot != "" {
			named[x.ev.Snapshot] = true
		}
	}
	for obj := range m.objects {
		if _, ok := wire.SnapshotRevision(name, obj); ok && !named[obj] {
			delete(m.objects, obj)
		}
	}
	return ctx.Err()
}

func (s *memPlans) LastEvent(ctx context.Context, subject string) (store.LastMessage, error) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	l := s.js.last(subject)
	if l == nil {
		return store.LastMessage{}, ctx.Err()
	}
	out := store.LastMessage{Seq: l.seq}
	if l.ev != nil {
		out.Revision = l.ev.Revision // the header the real stream's event carries
	}
	return out, ctx.Err()
}

func (s *memPlans) ReadLease(ctx context.Context, name string) (*bus.Lease, error) {
	s.js.mu.Lock()
	defer s.js.mu.Unlock()
	l := s.js.last(bus.LeaseSubject(name))
	if l == nil {
		return nil, ctx.Err()
	}
	out := *l.lease
	out.Seq = l.seq
	return &out, ctx.Err()
}

func (s *memPlans) WriteLease(ctx context.Context, name string, l *bus.Lease, expect uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("write lease %s: %w", name, err)
	}
	m := s.js
	m.mu.Lock()
	defer m.mu.Unlock()
	subject := bus.LeaseSubject(name)
	if last := m.last(subject); (last == nil && expect != 0) || (last != nil && last.seq != expect) {
		return 0, fmt.Errorf("write lease %s: %w", name, bus.ErrLeaseHeld)
	}
	now := m.clock.Now()
	// NATS keeps a message's TTL in whole seconds.
	ttl := (time.Duration(l.TTLSeconds*float64(time.Second)) + time.Second - 1).Truncate(time.Second)
	stored := *l
	m.seq++
	m.msgs = append(m.msgs, memMsg{seq: m.seq, subject: subject, at: now, expires: now.Add(ttl), lease: &stored})
	m.wrote()
	return m.seq, nil
}

func (s *memPlans) ReleaseLease(ctx context.Context, name string, seq uint64) error {
	m := s.js
	m.mu.Lock()
	defer m.mu.Unlock()
	subject := bus.LeaseSubject(name)
	if l := m.last(subject); l == nil || l.seq != seq {
		return ctx.Err() // lapsed or taken over: not ours to release
	}
	m.msgs = slices.DeleteFunc(m.msgs, func(x memMsg) bool { return x.subject == subject })
	m.wrote()
	return ctx.Err()
}

// memKV is one of memJS's KV buckets: every key's records, each a
// revision of the bucket's one sequence, keeping history records a key.
type memKV struct {
	js      *memJS
	bucket  string
	history int
	missing error
	// gone marks a bucket deleted (lose): binding it fails with missing
	// until Ensure makes it again, empty.
	gone bool
	seq  uint64
	recs []memEntry
}

// memEntry is one record of a memKV: a jetstream.KeyValueEntry.
type memEntry struct {
	bucket, key string
	value       []byte
	rev         uint64
	created     time.Time
	expires     time.Time // zero: never
	op          jetstream.KeyValueOp
	// heartbeat marks a put that repeats the last change's bytes; tomb, a
	// delete that is a planner's Tombstone (the inventory's).
	heartbeat, tomb bool
}

func (e memEntry) Bucket() string                  { return e.bucket }
func (e memEntry) Key() string                     { return e.key }
func (e memEntry) Value() []byte                   { return e.value }
func (e memEntry) Revision() uint64                { return e.rev }
func (e memEntry) Created() time.Time              { return e.created }
func (e memEntry) Delta() uint64                   { return 0 }
func (e memEntry) Operation() jetstream.KeyValueOp { return e.op }

// bind is the bucket, or its missing error; kv.js.mu is held.
func (kv *memKV) bind() error {
	if kv.gone {
		return kv.missing
	}
	return nil
}

// lose deletes the bucket, as an operator's kv del or a server restarted
// without its storage would.
func (kv *memKV) lose() {
	kv.js.mu.Lock()
	defer kv.js.mu.Unlock()
	kv.gone, kv.recs, kv.seq = true, nil, 0
	kv.js.wrote()
}

// ensure makes the bucket if it is gone; kv.js.mu is held.
func (kv *memKV) ensure() { kv.gone = false }

// latest is every key's newest record not expired, in revision order;
// kv.js.mu is held.
func (kv *memKV) latest() []memEntry {
	now := kv.js.clock.Now()
	last := map[string]int{}
	for i, e := range kv.recs {
		if e.expires.IsZero() || now.Before(e.expires) {
			last[e.key] = i
		} else if j, ok := last[e.key]; ok && j < i {
			delete(last, e.key)
		}
	}
	var out []memEntry
	for i, e := range kv.recs {
		if last[e.key] == i && (e.expires.IsZero() || now.Before(e.expires)) {
			out = append(out, e)
		}
	}
	return out
}

// current is key's newest record not expired; kv.js.mu is held.
func (kv *memKV) current(key string) (memEntry, bool) {
	for _, e := range slices.Backward(kv.latest()) {
		if e.key == key {
			return e, true
		}
	}
	return memEntry{}, false
}

// write appends a record to key, keeping history records of it, and
// returns its revision; kv.js.mu is held.
func (kv *memKV) write(key string, value []byte, op jetstream.KeyValueOp, ttl time.Duration) uint64 {
	now := kv.js.clock.Now()
	kv.seq++
	e := memEntry{bucket: kv.bucket, key: key, value: slices.Clone(value), rev: kv.seq, created: now, op: op}
	if ttl > 0 {
		e.expires = now.Add(ttl)
	}
	kv.recs = append(kv.recs, e)
	n := 0
	for i := len(kv.recs) - 1; i >= 0; i-- {
		if kv.recs[i].key != key {
			continue
		}
		if n++; n > kv.history {
			kv.recs = slices.Delete(kv.recs, i, i+1)
		}
	}
	kv.js.wrote()
	return kv.seq
}

// memBucket is a memKV as the kvBucket the service watches and writes.
type memBucket struct{ kv *memKV }

func (b memBucket) Create(ctx context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	kv := b.kv
	kv.js.mu.Lock()
	defer kv.js.mu.Unlock()
	if err := kv.bind(); err != nil {
		return 0, err
	}
	if e, ok := kv.current(key); ok && e.op == jetstream.KeyValuePut {
		return 0, jetstream.ErrKeyExists
	}
	return kv.write(key, value, jetstream.KeyValuePut, 0), ctx.Err()
}

func (b memBucket) History(ctx context.Context, key string, _ ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	kv := b.kv
	kv.js.mu.Lock()
	defer kv.js.mu.Unlock()
	if err := kv.bind(); err != nil {
		return nil, err
	}
	var out []jetstream.KeyValueEntry
	for _, e := range kv.recs {
		if e.key == key {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, jetstream.ErrKeyNotFound
	}
	return out, ctx.Err()
}

// WatchAll delivers every key's newest record (a delete marker too),
// then nil, then every record written, in revision order, until Stop
// or ctx; a bucket lost under it ends it (its channel closes).
func (b memBucket) WatchAll(ctx context.Context, _ ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	kv := b.kv
	kv.js.mu.Lock()
	if err := kv.bind(); err != nil {
		kv.js.mu.Unlock()
		return nil, err
	}
	initial := kv.latest()
	from := kv.seq
	kv.js.mu.Unlock()
	ctx, stop := context.WithCancel(ctx)
	w := &memWatcher{updates: make(chan jetstream.KeyValueEntry, 64), stop: stop}
	go func() {
		defer close(w.updates)
		for _, e := range initial {
			if !memSend[jetstream.KeyValueEntry](ctx, w.updates, e) {
				return
			}
		}
		if !memSend[jetstream.KeyValueEntry](ctx, w.updates, nil) {
			return
		}
		for {
			kv.js.mu.Lock()
			if kv.gone || kv.seq < from {
				kv.js.mu.Unlock()
				return
			}
			var next []memEntry
			for _, e := range kv.recs {
				if e.rev > from {
					next = append(next, e)
				}
			}
			from = kv.seq
			wake := kv.js.changed
			kv.js.mu.Unlock()
			for _, e := range next {
				if !memSend[jetstream.KeyValueEntry](ctx, w.updates, e) {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-wake:
			}
		}
	}()
	return w, nil
}

// memWatcher is a memBucket's watch.
type memWatcher struct {
	updates chan jetstream.KeyValueEntry
	stop    context.CancelFunc
}

func (w *memWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }
func (w *memWatcher) Stop() error                             { w.stop(); return nil }

// memSpecs is memJS's spec bucket as a specStore.
type memSpecs struct{ kv *memKV }

func (s memSpecs) Ensure(ctx context.Context) (kvBucket, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.ensure()
	return memBucket(s), ctx.Err()
}

// Bucket binds the bucket, making it where it is missing (as
// store.SpecStore does for the planner).
func (s memSpecs) Bucket(ctx context.Context) (kvBucket, error) { return s.Ensure(ctx) }

func (s memSpecs) Put(ctx context.Context, name string, spec []byte) (uint64, error) {
	if _, err := planner.ParseSpec(spec); err != nil {
		return 0, fmt.Errorf("%w: spec: %w", client.ErrBadRequest, err)
	}
	if err := store.ValidatePlanName(name); err != nil {
		return 0, err
	}
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.ensure()
	return s.kv.write(name, spec, jetstream.KeyValuePut, 0), ctx.Err()
}

func (s memSpecs) Entry(ctx context.Context, name string) (store.StoredSpec, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.ensure()
	e, ok := s.kv.current(name)
	if !ok || e.op != jetstream.KeyValuePut {
		return store.StoredSpec{}, fmt.Errorf("spec %s: %w", name, client.ErrNotFound)
	}
	return store.StoredSpec{Plan: name, Spec: slices.Clone(e.value), Revision: e.rev, Updated: e.created}, ctx.Err()
}

// Records is every key with a record; none is unreadable in memory.
func (s memSpecs) Records(ctx context.Context) (*store.SpecRecords, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return nil, fmt.Errorf("spec bucket stream: %w", jetstream.ErrStreamNotFound)
	}
	out := &store.SpecRecords{LastSeq: s.kv.seq, Keys: map[string]bool{}, Unreadable: map[string]bool{}}
	for _, e := range s.kv.latest() {
		out.Keys[e.key] = true
	}
	return out, ctx.Err()
}

// delete removes plan name's spec, leaving a delete marker.
func (s memSpecs) delete(name string) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.write(name, nil, jetstream.KeyValueDelete, 0)
}

// purge removes plan name's spec and its history, leaving a purge
// marker, as a KV purge does.
func (s memSpecs) purge(name string) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.recs = slices.DeleteFunc(s.kv.recs, func(e memEntry) bool { return e.key == name })
	s.kv.write(name, nil, jetstream.KeyValuePurge, 0)
}

// Delete removes plan name's spec as store.SpecStore.Delete does: a plan
// with no spec is ErrNotFound.
func (s memSpecs) Delete(ctx context.Context, name string) error {
	if err := store.ValidatePlanName(name); err != nil {
		return err
	}
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if e, ok := s.kv.current(name); !ok || e.op != jetstream.KeyValuePut {
		return fmt.Errorf("spec %s: %w", name, client.ErrNotFound)
	}
	s.kv.write(name, nil, jetstream.KeyValueDelete, 0)
	return ctx.Err()
}

// memDrains is memJS's drain bucket as a drainStore.
type memDrains struct{ kv *memKV }

func (s memDrains) Ensure(ctx context.Context) (kvBucket, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.ensure()
	return memBucket(s), ctx.Err()
}

func (s memDrains) Bucket(ctx context.Context) (kvBucket, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return nil, err
	}
	return memBucket(s), ctx.Err()
}

func (s memDrains) Put(ctx context.Context, d store.Drain) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: drain %s: %w", client.ErrBadRequest, d.Target(), err)
	}
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("drain %s: %w", d.Target(), err)
	}
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return err
	}
	s.kv.write(d.Key(), data, jetstream.KeyValuePut, 0)
	return ctx.Err()
}

// memInventory is memJS's inventory bucket as an inventoryStore, and the
// reporters' side of it (put, heartbeat, remove).
type memInventory struct{ kv *memKV }

func (s memInventory) Ensure(ctx context.Context) (kvBucket, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.ensure()
	return memBucket(s), ctx.Err()
}

// put stores node inv.NodeID's document, lasting ttl; a heartbeat
// repeats the last one's bytes, as a reporter's does.
func (s memInventory) put(inv inventory.NodeInventory, heartbeat bool, ttl time.Duration) (uint64, error) {
	data, err := json.Marshal(inv)
	if err != nil {
		return 0, fmt.Errorf("put inventory %s: %w", inv.NodeID, err)
	}
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return 0, err
	}
	rev := s.kv.write(inv.NodeID, data, jetstream.KeyValuePut, ttl)
	s.kv.recs[len(s.kv.recs)-1].heartbeat = heartbeat
	return rev, nil
}

// remove deletes node id's key, as a reporter shutting down does.
func (s memInventory) remove(id string, ttl time.Duration) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	s.kv.write(id, nil, jetstream.KeyValueDelete, ttl)
}

func (s memInventory) Tombstone(ctx context.Context, nodeID string, ttl time.Duration, seen uint64) (uint64, error) {
	if err := inventory.ValidateNodeID(nodeID); err != nil {
		return 0, err
	}
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return 0, err
	}
	if _, ok := s.kv.current(nodeID); ok {
		return 0, fmt.Errorf("delete inventory %s: %w", nodeID, store.ErrKeyMoved)
	}
	rev := s.kv.write(nodeID, nil, jetstream.KeyValueDelete, ttl)
	s.kv.recs[len(s.kv.recs)-1].tomb = true
	return rev, ctx.Err()
}

func (s memInventory) LastRevision(ctx context.Context) (uint64, error) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return 0, err
	}
	return s.kv.seq, ctx.Err()
}

// Watch delivers every node's document, then Synced, then every change
// in revision order; a key whose TTL runs out is Removed (ReasonExpired,
// no marker) once the clock passes it, as store.InventoryStore's watch
// notices it.
func (s memInventory) Watch(ctx context.Context) (<-chan store.Event, error) {
	kv := s.kv
	kv.js.mu.Lock()
	if err := kv.bind(); err != nil {
		kv.js.mu.Unlock()
		return nil, fmt.Errorf("watch inventory: %w", err)
	}
	kv.js.mu.Unlock()
	out := make(chan store.Event, 64)
	go func() {
		defer close(out)
		var from uint64
		// held is each key delivered and not removed since: its last
		// record.
		held := map[string]memEntry{}
		synced := false
		for {
			kv.js.mu.Lock()
			if kv.gone {
				kv.js.mu.Unlock()
				return
			}
			now := kv.js.clock.Now()
			var evs []store.Event
			if !synced {
				for _, e := range kv.latest() {
					if e.op == jetstream.KeyValuePut {
						held[e.key] = e
						e.heartbeat = false // the document, read whole
						evs = append(evs, s.event(e))
					}
				}
				evs = append(evs, store.Event{Op: store.Synced})
				from, synced = kv.seq, true
			}
			for _, e := range kv.recs {
				if e.rev <= from {
					continue
				}
				switch e.op {
				case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
					reason := store.ReasonDeleted
					switch {
					case e.tomb:
						reason = store.ReasonExpired
					case e.op == jetstream.KeyValuePurge:
						reason = store.ReasonPurged
					}
					evs = append(evs, store.Event{Op: store.Removed, NodeID: e.key, Revision: e.rev, Reason: reason, Marker: true})
					delete(held, e.key)
				default:
					held[e.key] = e
					evs = append(evs, s.event(e))
				}
			}
			from = kv.seq
			// expire cuts a record's TTL short in place: the watch goes by
			// the record's expiry, not the one it held when it delivered it.
			expires := make(map[uint64]time.Time, len(kv.recs))
			for _, r := range kv.recs {
				expires[r.rev] = r.expires
			}
			var next time.Time
			for key, e := range held {
				if at, ok := expires[e.rev]; ok && !at.Equal(e.expires) {
					e.expires = at
					held[key] = e
				}
				switch {
				case e.expires.IsZero():
				case !now.Before(e.expires):
					evs = append(evs, store.Event{Op: store.Removed, NodeID: key, Revision: e.rev, Reason: store.ReasonExpired, TTL: e.expires.Sub(e.created)})
					delete(held, key)
				case next.IsZero() || e.expires.Before(next):
					next = e.expires
				}
			}
			wake := kv.js.changed
			kv.js.mu.Unlock()
			for _, ev := range evs {
				if !memSend(ctx, out, ev) {
					return
				}
			}
			var timer <-chan time.Time
			stop := func() bool { return false }
			if !next.IsZero() {
				t := kv.js.clock.NewTimer(next.Sub(now))
				timer, stop = t.C(), t.Stop
			}
			select {
			case <-ctx.Done():
				stop()
				return
			case <-wake:
			case <-timer:
			}
			stop()
		}
	}()
	return out, nil
}

// event is record e as the watch delivers it; its value is a document
// put, which the reporter's side made from an inventory.NodeInventory.
func (s memInventory) event(e memEntry) store.Event {
	ev := store.Event{Op: store.Changed, NodeID: e.key, Revision: e.rev}
	if e.heartbeat {
		ev.Op = store.Heartbeat
	} else if err := json.Unmarshal(e.value, &ev.Inventory); err != nil {
		return store.Event{Op: store.Rejected, NodeID: e.key, Revision: e.rev, Reason: err.Error(), Rejection: store.RejectUnparsable}
	}
	if !e.expires.IsZero() {
		ev.ExpiresAt, ev.TTL = e.expires, e.expires.Sub(e.created)
	}
	return ev
}

// memSend sends v on out unless ctx ends first.
func memSend[T any](ctx context.Context, out chan<- T, v T) bool {
	select {
	case out <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// memLink is memJS's link: always connected, never reconnecting; its
// state streams are there unless their bucket was lost.
type memLink struct{ js *memJS }

var _ link = memLink{}

func (memLink) Reconnects() uint64 { return 0 }
func (memLink) Connected() bool    { return true }

// BodyLimit is a default server's (1 MiB), less the headers' room, as
// bus.BodyLimit says of one.
func (memLink) BodyLimit() int { return 1<<20 - 16<<10 }

func (l memLink) Stream(ctx context.Context, name string) (streamState, error) {
	m := l.js
	m.mu.Lock()
	defer m.mu.Unlock()
	kv := map[string]*memKV{bus.InventoryStream: m.inv, "KV_" + client.SpecBucket: m.specs, "KV_" + client.DrainBucket: m.drains}[name]
	switch {
	case kv != nil && kv.gone:
		return streamState{}, jetstream.ErrStreamNotFound
	case kv != nil:
		return streamState{LastSeq: kv.seq, Msgs: uint64(len(kv.recs))}, ctx.Err()
	}
	return streamState{LastSeq: m.seq, Msgs: uint64(len(m.msgs))}, ctx.Err()
}

// expire makes node id's key run out now, as its TTL would once its
// reporter stopped: what a reporter killed comes to, without the wait.
func (s memInventory) expire(id string) {
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	now := s.kv.js.clock.Now()
	for i := range s.kv.recs {
		if e := &s.kv.recs[i]; e.key == id && (e.expires.IsZero() || now.Before(e.expires)) {
			e.expires = now
		}
	}
	s.kv.js.wrote()
}

// onMem makes p plan on m's stores (each planner its own publisher
// name, as New gives it) and link.
func (m *memJS) onMem(p *Service) {
	p.plans = m.plans(nuid.Next())
	p.specs, p.inv, p.drains, p.link = memSpecs{m.specs}, memInventory{m.inv}, memDrains{m.drains}, memLink{m}
	p.ownerStore = memOwners{m}
}

// memOwners is the owners bucket: each node's UUIDs, which only grow.
type memOwners struct{ js *memJS }

func (o memOwners) Ensure(context.Context) error { return nil }

func (o memOwners) Load(ctx context.Context) (map[string]string, error) {
	o.js.mu.Lock()
	defer o.js.mu.Unlock()
	owners := map[string]string{}
	for n, us := range o.js.owners {
		for _, u := range us {
			owners[u] = n
		}
	}
	return owners, nil
}

func (o memOwners) Add(ctx context.Context, node string, uuids []string, now time.Time) error {
	o.js.mu.Lock()
	defer o.js.mu.Unlock()
	if o.js.owners == nil {
		o.js.owners = map[string][]string{}
	}
	for _, u := range uuids {
		if !slices.Contains(o.js.owners[node], u) {
			o.js.owners[node] = append(o.js.owners[node], u)
		}
	}
	return nil
}

// revisions is plan name's revisions the stream keeps, oldest first (a
// history's).
func (m *memJS) revisions(name string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for _, x := range m.live(client.PlanEventSubject(name)) {
		out = append(out, x.ev.Revision)
	}
	return out
}

// undrain ends the drain of node (gpu nil) or its GPU as
// store.DrainStore.Undrain does: the audit record, then the delete; a
// target not drained is ErrNotFound.
func (s memDrains) undrain(node string, gpu *int, by string, at time.Time) error {
	key := store.DrainKey(node, gpu)
	s.kv.js.mu.Lock()
	defer s.kv.js.mu.Unlock()
	if err := s.kv.bind(); err != nil {
		return err
	}
	e, ok := s.kv.current(key)
	if !ok || e.op != jetstream.KeyValuePut {
		return fmt.Errorf("undrain %s: not drained: %w", plan.Drain{NodeID: node, GPU: gpu}.Target(), client.ErrNotFound)
	}
	d, err := store.DecodeDrain(key, e.value)
	if err != nil {
		d = store.Drain{NodeID: node, GPU: gpu, Cause: plan.DrainOperator}
	}
	d.Undrained, d.By, d.At = true, by, at.UTC()
	data, _ := json.Marshal(d) // plain data
	s.kv.write(key, data, jetstream.KeyValuePut, 0)
	s.kv.write(key, nil, jetstream.KeyValueDelete, 0)
	return nil
}
