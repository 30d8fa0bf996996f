package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// Revision is one revision of a plan: its event as the stream holds it
// and its document, whole.
//
// A document that places workers is valid (every worker placed) or
// degraded (Document.Status.State StateDegraded: a fault left some workers
// without a place; Valid() is false, the workers it places run, and Unplaced lists
// the others with where they ran last, to which they return). Launchers
// run the workers of either: test Document.Placed(), not Valid(). A
// document whose PendingSpec is set keeps the last spec's placement
// while the stored spec cannot be placed.
type Revision struct {
	Event    *plan.Event
	Document *plan.Document
	// Meta is where the event sits in the stream and what its headers
	// say of it.
	Meta
}

// Info is one revision as a history lists it, read from its headers.
type Info struct {
	Revision int
	// Meta is where the event sits in the stream and what its headers
	// say of it.
	Meta
	Time  time.Time
	Valid bool
	// State is valid, degraded or invalid (the event's state header);
	// for an event from before states, what Valid says.
	State  plan.State
	Moved  int
	Reason string
	Error  string
	Kind   string
}

func infoOf(seq uint64, t time.Time, h nats.Header) Info {
	rev, _ := strconv.Atoi(h.Get(RevisionHeader))
	moved, _ := strconv.Atoi(h.Get(MovedHeader))
	valid := h.Get(ValidHeader) == "true"
	state := plan.State(h.Get(StateHeader))
	switch {
	case valid:
		state = plan.StateValid
	case state != plan.StateDegraded:
		state = plan.StateInvalid
	}
	return Info{Revision: rev, Meta: metaOf(seq, h), Time: t, Valid: valid, State: state, Moved: moved,
		Reason: h.Get(ReasonHeader), Error: h.Get(ErrorHeader), Kind: h.Get(KindHeader)}
}

// plans is the plan stream, for direct gets.
func (c *Client) plans(ctx context.Context) (jetstream.Stream, error) {
	st, err := c.js.Stream(ctx, PlansStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s: %w (no planner has run)", PlansStream, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", PlansStream, err)
	}
	return st, nil
}

// Plan rebuilds revision rev of plan name (0: the latest) from the
// stream and its snapshots, as subjects.md describes: the revision's
// event; if it carries a change, its base revision (a whole document or
// a snapshot object) and the changes after it, up to rev. It needs no
// planner, only the stream. ErrNotFound when there is no such revision.
func (c *Client) Plan(ctx context.Context, name string, rev int) (*Revision, error) {
	st, err := c.plans(ctx)
	if err != nil {
		return nil, err
	}
	var m *jetstream.RawStreamMsg
	if rev == 0 {
		m, err = lastEvent(ctx, st, name)
	} else {
		m, err = eventAt(ctx, st, name, rev)
	}
	if err != nil {
		return nil, err
	}
	return c.rebuild(ctx, st, name, m)
}

// lastEvent is plan name's newest event.
func lastEvent(ctx context.Context, st jetstream.Stream, name string) (*jetstream.RawStreamMsg, error) {
	m, err := st.GetLastMsgForSubject(ctx, PlanEventSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("plan %s: %w (no revision published yet)", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", name, err)
	}
	return m, nil
}

// eventAt finds the event of revision rev by binary search over stream
// sequences (revisions grow with sequence on the plan's subject), each
// probe a direct get of the next event at or after a sequence: a few
// dozen reads at most, whatever the history.
func eventAt(ctx context.Context, st jetstream.Stream, name string, rev int) (*jetstream.RawStreamMsg, error) {
	last, err := lastEvent(ctx, st, name)
	if err != nil {
		return nil, err
	}
	subject := PlanEventSubject(name)
	lo, hi := uint64(1), last.Sequence
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := st.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid - 1
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("plan %s revision %d: %w", name, rev, err)
		}
		r, _ := strconv.Atoi(m.Header.Get(RevisionHeader))
		switch {
		case r == rev:
			return m, nil
		case r < rev:
			lo = m.Sequence + 1
		default:
			hi = mid - 1
		}
	}
	return nil, fmt.Errorf("plan %s revision %d: %w", name, rev, ErrNotFound)
}

// eventMeta is the metadata of event ev, read at seq with headers h: its
// body, checked against the headers, has the last word on its base.
func eventMeta(seq uint64, h nats.Header, ev *plan.Event) Meta {
	m := metaOf(seq, h)
	m.Base = ev.Base
	return m
}

func decodeEvent(m *jetstream.RawStreamMsg) (*plan.Event, error) {
	var ev plan.Event
	if err := wire.Decode(m.Data, m.Header, &ev); err != nil {
		return nil, fmt.Errorf("event at sequence %d: %w: %w", m.Sequence, ErrUnreadable, err)
	}
	if h := m.Header.Get(RevisionHeader); h != strconv.Itoa(ev.Revision) || PlanEventSubject(ev.Name) != m.Subject {
		return nil, fmt.Errorf("event at sequence %d: %w: plan %q revision %d on %s, header revision %s", m.Sequence, ErrUnreadable, ev.Name, ev.Revision, m.Subject, h)
	}
	return &ev, nil
}

// rebuild makes the whole document of event m. A revision whose event
// exists but cannot be rebuilt (its base or snapshot gone, a gap in its
// chain, an event that contradicts the scheme) is ErrUnreadable, never
// ErrNotFound: the plan exists.
func (c *Client) rebuild(ctx context.Context, st jetstream.Stream, name string, m *jetstream.RawStreamMsg) (*Revision, error) {
	ev, err := decodeEvent(m)
	if err != nil {
		return nil, err
	}
	out := &Revision{Event: ev, Meta: eventMeta(m.Sequence, m.Header, ev)}
	if ev.Kind() != "change" {
		out.Document, err = c.whole(ctx, ev)
		return out, unreadable(err)
	}
	if ev.Base >= ev.Revision || ev.Base < 1 {
		return nil, fmt.Errorf("plan %s revision %d: %w: base %d", name, ev.Revision, ErrUnreadable, ev.Base)
	}
	baseMsg, err := eventAt(ctx, st, name, ev.Base)
	if err != nil {
		return nil, fmt.Errorf("plan %s revision %d: base %d: %w", name, ev.Revision, ev.Base, unreadable(err))
	}
	base, err := decodeEvent(baseMsg)
	if err != nil {
		return nil, err
	}
	doc, err := c.whole(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("plan %s revision %d: %w", name, ev.Revision, unreadable(err))
	}
	// The chain is the change events after the base, each the next
	// revision, ending at m itself.
	r := plan.NewReplay(doc)
	for seq := baseMsg.Sequence + 1; r.Revision() < ev.Revision; {
		next, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(PlanEventSubject(name)))
		if err != nil {
			return nil, fmt.Errorf("plan %s after revision %d: %w", name, r.Revision(), unreadable(err))
		}
		e, err := decodeEvent(next)
		if err != nil {
			return nil, err
		}
		if e.Kind() != "change" || e.Base != ev.Base || next.Sequence > m.Sequence || (e.Revision == ev.Revision) != (next.Sequence == m.Sequence) {
			return nil, fmt.Errorf("plan %s revision %d: %w: the chain from base %d breaks at sequence %d", name, ev.Revision, ErrUnreadable, ev.Base, next.Sequence)
		}
		if err := r.Apply(e); err != nil {
			return nil, fmt.Errorf("plan %s: %w: %w", name, ErrUnreadable, err)
		}
		seq = next.Sequence + 1
	}
	out.Document = r.Document()
	return out, nil
}

// unreadable makes a missing piece of a revision that exists (its base,
// snapshot or a chain event) ErrUnreadable; other errors (JetStream
// away) stay as they are.
func unreadable(err error) error {
	if errors.Is(err, ErrNotFound) || errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
		// Not %w: the revision exists; what is missing is a piece of it.
		return fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	return err
}

// whole is the document of an event that carries or names it whole.
func (c *Client) whole(ctx context.Context, ev *plan.Event) (*plan.Document, error) {
	if ev.Placement != nil {
		return &plan.Document{Header: ev.Header, Placement: *ev.Placement}, nil
	}
	if ev.Snapshot == "" || ev.Base != ev.Revision {
		return nil, fmt.Errorf("revision %d: %w: neither whole nor a snapshot", ev.Revision, ErrUnreadable)
	}
	if rev, ok := wire.SnapshotRevision(ev.Name, ev.Snapshot); !ok || rev != ev.Revision {
		return nil, fmt.Errorf("revision %d: %w: snapshot %q is not one of its", ev.Revision, ErrUnreadable, ev.Snapshot)
	}
	var d plan.Document
	if err := c.getObject(ctx, PlansBucket, ev.Snapshot, wire.MaxObject, &d); err != nil {
		return nil, fmt.Errorf("snapshot of revision %d: %w", ev.Revision, err)
	}
	if d.Revision != ev.Revision || d.Name != ev.Name {
		return nil, fmt.Errorf("snapshot of revision %d: %w: holds %s revision %d", ev.Revision, ErrUnreadable, d.Name, d.Revision)
	}
	return &d, nil
}

// History calls fn with every revision of plan name the stream keeps,
// oldest first, until fn returns false. It reads headers only, with a
// consumer it deletes when done.
func (c *Client) History(ctx context.Context, name string, fn func(Info) bool) error {
	st, err := c.plans(ctx)
	if err != nil {
		return err
	}
	last, err := lastEvent(ctx, st, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{PlanEventSubject(name)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("plan history %s: %w", name, err)
	}
	defer c.dropConsumer(PlansStream, cons)
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("plan history %s: %w", name, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("plan history %s: %w", name, err)
			}
			if !fn(infoOf(md.Sequence.Stream, md.Timestamp, m.Headers())) || md.Sequence.Stream >= last.Sequence {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("plan history %s: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("plan history %s: stream ended before sequence %d", name, last.Sequence)
		}
	}
}

// dropConsumer deletes an ordered consumer now rather than leave it to
// expire on the server.
func (c *Client) dropConsumer(stream string, cons jetstream.Consumer) {
	if info := cons.CachedInfo(); info != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.js.DeleteConsumer(ctx, stream, info.Name)
	}
}

// FollowOptions tune Follow.
type FollowOptions struct {
	// Skip, when set, is asked about every new revision before it is
	// read; a revision it skips is not delivered (a planner skips its
	// own).
	Skip func(Info) bool
	// Republished follows without a consumer: a subscription to the
	// stream's republished headers (PlanRepublishPrefix+name) cues
	// direct gets, and a poll now and then, and after a reconnect,
	// reads whatever a lost cue would have said. It takes no slot of
	// the stream's consumer cap, so a client holding every slot cannot
	// delay it (the planner's standbys and GPU map follow so); it needs
	// to subscribe there, which only the planner's account may under
	// --auth.
	Republished bool
	// SkipLatest asks Skip about the latest revision too, on its event's
	// headers, before reading it: one it skips is neither read nor
	// delivered, and the follow goes on from it. A planner that has read
	// the latest already so does not hold a second copy of a large plan
	// while it starts.
	SkipLatest bool
}

// followStart is where a follow of plan name starts: the latest
// revision, whole; or, when opts skips it (SkipLatest), nil and its
// event, unread beyond its headers.
func (c *Client) followStart(ctx context.Context, st jetstream.Stream, name string, opts FollowOptions) (*Revision, *jetstream.RawStreamMsg, error) {
	m, err := lastEvent(ctx, st, name)
	if err != nil {
		return nil, nil, err
	}
	if opts.SkipLatest && opts.Skip != nil && opts.Skip(infoOf(m.Sequence, m.Time, m.Header)) {
		return nil, m, nil
	}
	cur, err := c.rebuild(ctx, st, name, m)
	return cur, m, err
}

// Follow delivers the latest revision of plan name, whole (unless
// SkipLatest skips it), and then every new one, until ctx is done; the
// channel is then closed. It survives reconnects. Each revision is
// rebuilt from the one before where its event carries a change.
func (c *Client) Follow(ctx context.Context, name string, opts FollowOptions) (<-chan *Revision, error) {
	if opts.Republished {
		return c.followRepublished(ctx, name, opts)
	}
	st, err := c.plans(ctx)
	if err != nil {
		return nil, err
	}
	cur, last, err := c.followStart(ctx, st, name, opts)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{PlanEventSubject(name)}, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case err == nil && cur != nil:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cur.Seq+1
	case err == nil: // skipped (SkipLatest)
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last.Sequence+1
	case errors.Is(err, ErrUnreadable):
		// The latest cannot be read: follow what comes after it.
		cur = nil
		if last, lerr := lastEvent(ctx, st, name); lerr == nil {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last.Sequence+1
		}
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("follow plan %s: %w", name, err)
	}
	it, err := cons.Messages(wire.FollowHeartbeat()...)
	if err != nil {
		c.dropConsumer(PlansStream, cons)
		return nil, fmt.Errorf("follow plan %s: %w", name, err)
	}
	out := make(chan *Revision, 16)
	go func() {
		defer close(out)
		defer c.dropConsumer(PlansStream, cons)
		stop := context.AfterFunc(ctx, it.Stop)
		defer stop()
		f := follower{c: c, st: st, name: name, opts: opts}
		if cur != nil {
			f.replay = plan.NewReplay(cur.Document)
			if !send(ctx, out, cur) {
				return
			}
		}
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			if r := f.next(ctx, m); r != nil && !send(ctx, out, r) {
				return
			}
		}
	}()
	return out, nil
}

// follower applies a plan's events as they come.
type follower struct {
	c      *Client
	st     jetstream.Stream
	name   string
	opts   FollowOptions
	replay *plan.Replay
}

// next reads one event: applied to the revision before where it carries
// a change, else rebuilt; nil when skipped or unreadable.
func (f *follower) next(ctx context.Context, m jetstream.Msg) *Revision {
	md, err := m.Metadata()
	if err != nil {
		return nil
	}
	return f.apply(ctx, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp})
}

// apply is next of a message read however (a consumer's delivery, a
// direct get).
func (f *follower) apply(ctx context.Context, raw *jetstream.RawStreamMsg) *Revision {
	if f.skips(infoOf(raw.Sequence, raw.Time, raw.Header)) {
		return nil
	}
	ev, err := decodeEvent(raw)
	if err != nil {
		return nil
	}
	r := &Revision{Event: ev, Meta: eventMeta(raw.Sequence, raw.Header, ev)}
	if f.replay != nil && ev.Follows(f.replay.Revision()) && f.replay.Apply(ev) == nil {
		r.Document = f.replay.Document()
		return r
	}
	whole, err := f.c.rebuild(ctx, f.st, f.name, raw)
	if err != nil {
		return nil
	}
	f.replay = plan.NewReplay(whole.Document)
	return whole
}

// skips asks opts.Skip about a revision; one it skips breaks the chain
// of replayed changes, which continues without it.
func (f *follower) skips(i Info) bool {
	if f.opts.Skip != nil && f.opts.Skip(i) {
		f.replay = nil
		return true
	}
	return false
}

func send[T any](ctx context.Context, out chan<- T, v T) bool {
	select {
	case out <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// EventSeq is the stream sequence of revision rev's event of plan name.
func (c *Client) EventSeq(ctx context.Context, name string, rev int) (uint64, error) {
	st, err := c.plans(ctx)
	if err != nil {
		return 0, err
	}
	m, err := eventAt(ctx, st, name, rev)
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}
