package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/plan"
)

// PlanRepublishSubject is where the plan stream republishes the headers
// of each event of plan name it stores.
func PlanRepublishSubject(name string) string { return PlanRepublishPrefix + name }

// A republished follow reads the latest event every republishedPoll,
// and within republishedTick of a reconnect: the cues are core NATS
// messages, lost while the connection is down (or dropped by a slow
// subscriber), and a lost cue must cost seconds at most, not the
// revision.
const (
	republishedTick = 500 * time.Millisecond
	republishedPoll = 2 * time.Second
)

// Cue is one republished event's headers, as the stream stored them:
// where it is (Seq), the plan subject's event before it (Prev), and its
// revision's headers.
type Cue struct {
	Plan      string
	Seq, Prev uint64
	Info      Info
}

// CueOf reads a message of PlanRepublishPrefix+NAME; false for one the
// plan stream did not republish. A consumer's delivery someone pointed
// at the subject (a push consumer a client makes may name any deliver
// subject) carries an ack reply, which a republish never does; a cue is
// a hint either way, and followers read the event itself from the
// stream.
func CueOf(m *nats.Msg) (Cue, bool) {
	if m.Reply != "" || len(m.Subject) <= len(PlanRepublishPrefix) || m.Subject[:len(PlanRepublishPrefix)] != PlanRepublishPrefix ||
		m.Header.Get(jetstream.StreamHeader) != PlansStream {
		return Cue{}, false
	}
	name := m.Subject[len(PlanRepublishPrefix):]
	if m.Header.Get(jetstream.SubjectHeader) != PlanEventSubject(name) {
		return Cue{}, false
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return Cue{}, false
	}
	prev, err := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if err != nil || prev >= seq {
		return Cue{}, false
	}
	t, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	return Cue{Plan: name, Seq: seq, Prev: prev, Info: infoOf(seq, t, m.Header)}, true
}

// republished is one republished follow: the goroutine that runs it
// alone writes it.
type republished struct {
	follower
	out chan<- *Revision
	// last is the stream sequence of the newest event read (or skipped
	// on its cue), rev its revision.
	last uint64
	rev  int
}

// errRewritten is a plan history that no longer holds the event a
// follow read last (the stream made again, the plan's subject purged):
// the follow ends, and its caller follows again from the latest.
var errRewritten = errors.New("the plan's history was rewritten under the follow")

// followRepublished is Follow without a consumer (FollowOptions.Republished).
func (c *Client) followRepublished(ctx context.Context, name string, opts FollowOptions) (<-chan *Revision, error) {
	st, err := c.plans(ctx)
	if err != nil {
		return nil, err
	}
	// Subscribed before the latest is read, so that nothing stored after
	// it goes uncued; the connection sends the two in order.
	cues, lost := make(chan Cue, 64), make(chan struct{}, 1)
	sub, err := c.nc.Subscribe(PlanRepublishSubject(name), func(m *nats.Msg) {
		cue, ok := CueOf(m)
		if !ok {
			return
		}
		select {
		case cues <- cue:
		default: // the follow is busy: it reads the newest at once instead
			select {
			case lost <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("follow plan %s: %w", name, err)
	}
	// Cues are headers: a flood pointed here (a push consumer delivering
	// whole events, which CueOf drops) is dropped past these, not queued
	// in memory; a cue lost so is made up by the poll.
	_ = sub.SetPendingLimits(4096, 4<<20)
	f := &republished{follower: follower{c: c, st: st, name: name, opts: opts}}
	cur, last, err := c.followStart(ctx, st, name, opts)
	switch {
	case err == nil && cur != nil:
		f.last, f.rev = cur.Seq, cur.Event.Revision
	case err == nil: // skipped (SkipLatest)
		f.last, f.rev = last.Sequence, infoOf(last.Sequence, last.Time, last.Header).Revision
	case errors.Is(err, ErrUnreadable):
		// The latest cannot be read: follow what comes after it.
		cur = nil
		last, lerr := lastEvent(ctx, st, name)
		if lerr != nil {
			_ = sub.Unsubscribe()
			return nil, lerr
		}
		f.last = last.Sequence
		f.rev, _ = strconv.Atoi(last.Header.Get(RevisionHeader))
	case !errors.Is(err, ErrNotFound):
		_ = sub.Unsubscribe()
		return nil, err
	}
	out := make(chan *Revision, 16)
	f.out = out
	go func() {
		defer close(out)
		defer func() { _ = sub.Unsubscribe() }()
		if cur != nil {
			f.replay = plan.NewReplay(cur.Document)
			if !send(ctx, out, cur) {
				return
			}
		}
		f.run(ctx, cues, lost)
	}()
	return out, nil
}

// run reads the plan's events as cues and polls find them, until ctx
// ends or the history is rewritten.
func (f *republished) run(ctx context.Context, cues <-chan Cue, lost <-chan struct{}) {
	tick := time.NewTicker(republishedTick)
	defer tick.Stop()
	reconnects, polled := f.c.nc.Stats().Reconnects, time.Now()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case cue := <-cues:
			err = f.cued(ctx, cue)
		case <-lost:
			err = f.poll(ctx)
		case now := <-tick.C:
			r := f.c.nc.Stats().Reconnects
			if r == reconnects && now.Sub(polled) < republishedPoll {
				continue
			}
			reconnects, polled = r, now
			err = f.poll(ctx)
		}
		if errors.Is(err, errRewritten) || ctx.Err() != nil || err != nil && f.gone(ctx) {
			return
		}
		// Another error (NATS away) is tried again at the next poll.
	}
}

// gone says whether the plan stream is no more (the follow ends, as a
// consumer's would with its stream).
func (f *republished) gone(ctx context.Context) bool {
	_, err := f.c.plans(ctx)
	return errors.Is(err, ErrNotFound)
}

// cued reads the event cue announces, and any before it the follow has
// not read (a lost cue).
func (f *republished) cued(ctx context.Context, cue Cue) error {
	switch {
	case cue.Seq <= f.last:
		if cue.Info.Revision > f.rev {
			// A newer revision at a sequence already read: the stream
			// started its sequence again.
			return errRewritten
		}
		return nil // read already, by a poll
	case cue.Prev < f.last:
		// The event before it is not the one read last: that one is
		// no longer the subject's.
		return errRewritten
	case cue.Prev == f.last && f.skips(cue.Info):
		// Skipped on its headers alone: no need to read it.
		f.last, f.rev = cue.Seq, cue.Info.Revision
		return nil
	case cue.Prev == f.last:
		m, err := f.st.GetMsg(ctx, cue.Seq)
		if err != nil {
			return err
		}
		if m.Subject != PlanEventSubject(f.name) {
			return f.catchUp(ctx, cue.Seq)
		}
		return f.deliver(ctx, m)
	}
	return f.catchUp(ctx, cue.Seq)
}

// poll reads the newest event, and those between the one read last and
// it.
func (f *republished) poll(ctx context.Context) error {
	m, err := f.st.GetLastMsgForSubject(ctx, PlanEventSubject(f.name))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if f.last > 0 {
			return errRewritten
		}
		return nil
	case err != nil:
		return err
	case m.Sequence < f.last:
		return errRewritten
	case m.Sequence == f.last:
		return nil
	}
	if err := f.catchUp(ctx, m.Sequence-1); err != nil {
		return err
	}
	return f.deliver(ctx, m)
}

// catchUp reads the plan's events after the one read last, in order, up
// to stream sequence upTo.
func (f *republished) catchUp(ctx context.Context, upTo uint64) error {
	for f.last < upTo {
		m, err := f.st.GetMsg(ctx, f.last+1, jetstream.WithGetMsgSubject(PlanEventSubject(f.name)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.Sequence > upTo {
			return nil // read at its own cue, or the poll's
		}
		if err := f.deliver(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// deliver applies event m and sends the revision it makes, if any.
func (f *republished) deliver(ctx context.Context, m *jetstream.RawStreamMsg) error {
	f.last = m.Sequence
	f.rev, _ = strconv.Atoi(m.Header.Get(RevisionHeader))
	if r := f.apply(ctx, m); r != nil && !send(ctx, f.out, r) {
		return ctx.Err()
	}
	return nil
}
