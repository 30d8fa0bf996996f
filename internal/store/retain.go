package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// Retain drops the oldest revisions of plan name past the history limits:
// those older than maxAge, and, while the plan stream and its object
// store (every plan's events, snapshots and oversized assignments) hold
// more than maxBytes, the oldest chains (a negative limit is no limit). It cuts only just
// before a revision whose event carries or names its whole placement, and
// never past the newest such revision, so that every revision kept can be
// rebuilt; then it deletes the snapshots no revision kept needs.
func (s *PlanStore) Retain(ctx context.Context, name string, maxAge time.Duration, maxBytes int64, now time.Time) error {
	st, err := s.js.Stream(ctx, client.PlansStream)
	if err != nil {
		return fmt.Errorf("retain plan %s: %w", name, err)
	}
	subject := client.PlanEventSubject(name)
	keep := 0
	if maxAge >= 0 {
		if keep, err = s.keepByAge(ctx, st, subject, now.Add(-maxAge)); err != nil {
			return fmt.Errorf("retain plan %s: %w", name, err)
		}
		if err := s.cut(ctx, st, name, keep); err != nil {
			return err
		}
	}
	for range 64 {
		size, err := s.stored(ctx, st)
		if err != nil {
			return fmt.Errorf("retain plan %s: %w", name, err)
		}
		if maxBytes < 0 || size <= maxBytes {
			return nil
		}
		next, err := nextWhole(ctx, st, subject)
		if err != nil || next == 0 {
			return err
		}
		if err := s.cut(ctx, st, name, next); err != nil {
			return err
		}
	}
	return nil
}

// stored is the bytes of the plan stream and its object store.
func (s *PlanStore) stored(ctx context.Context, st jetstream.Stream) (int64, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	obs, err := s.js.ObjectStore(ctx, client.PlansBucket)
	if err != nil {
		return 0, err
	}
	status, err := obs.Status(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.State.Bytes + status.Size()), nil
}

// event reads the headers of the first event on subject at or after seq.
func event(ctx context.Context, st jetstream.Stream, subject string, seq uint64) (*jetstream.RawStreamMsg, int, int, error) {
	m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return nil, 0, 0, err
	}
	rev, _ := strconv.Atoi(m.Header.Get(client.RevisionHeader))
	base, _ := strconv.Atoi(m.Header.Get(client.BaseHeader))
	return m, rev, base, nil
}

// keepByAge is the revision to keep from so that no revision newer than
// cutoff is lost: the base of the oldest such revision (0: keep all).
func (s *PlanStore) keepByAge(ctx context.Context, st jetstream.Stream, subject string, cutoff time.Time) (int, error) {
	first, _, _, err := event(ctx, st, subject, 1)
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && !first.Time.Before(cutoff) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	last, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return 0, err
	}
	// The oldest event at or after cutoff, by binary search over sequences.
	lo, hi, found := first.Sequence, last.Sequence, last
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := st.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			return 0, err
		}
		if m.Time.Before(cutoff) {
			lo = m.Sequence + 1
		} else {
			found, hi = m, mid-1
		}
	}
	base, _ := strconv.Atoi(found.Header.Get(client.BaseHeader))
	return base, nil
}

// nextWhole is the second whole-document revision from the oldest event
// on subject: cutting before it drops the oldest chain. 0 when the oldest
// chain is the newest.
func nextWhole(ctx context.Context, st jetstream.Stream, subject string) (int, error) {
	m, _, _, err := event(ctx, st, subject, 1)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	for err == nil {
		var rev, base int
		if m, rev, base, err = event(ctx, st, subject, m.Sequence+1); err == nil && base == rev {
			return rev, nil
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	return 0, err
}

// cut purges plan name's events before revision keep's and the snapshots
// of revisions before it.
func (s *PlanStore) cut(ctx context.Context, st jetstream.Stream, name string, keep int) error {
	if keep <= 1 {
		return nil
	}
	seq, err := s.client.EventSeq(ctx, name, keep)
	if err != nil {
		return fmt.Errorf("retain plan %s: %w", name, err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(client.PlanEventSubject(name)), jetstream.WithPurgeSequence(seq)); err != nil {
		return fmt.Errorf("retain plan %s: purge: %w", name, err)
	}
	obs, err := s.js.ObjectStore(ctx, client.PlansBucket)
	if err != nil {
		return fmt.Errorf("retain plan %s: %w", name, err)
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("retain plan %s: list snapshots: %w", name, err)
	}
	for _, info := range infos {
		if rev, ok := wire.SnapshotRevision(name, info.Name); ok && rev < keep {
			_ = obs.Delete(ctx, info.Name)
		}
	}
	return nil
}
