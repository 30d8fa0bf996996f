package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// ReadLease reads plan name's lease; nil and no error when nobody holds
// it.
func (s *PlanStore) ReadLease(ctx context.Context, name string) (*bus.Lease, error) {
	st, err := s.js.Stream(ctx, client.PlansStream)
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.LeaseSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", name, err)
	}
	var l bus.Lease
	if err := json.Unmarshal(m.Data, &l); err != nil {
		return nil, fmt.Errorf("read lease %s: message %d: %w", name, m.Sequence, err)
	}
	l.Seq = m.Sequence
	return &l, nil
}

// WriteLease stores l as plan name's lease, lasting l.TTLSeconds, if the
// lease subject's last message is still expect (0: none, the lease is
// free); it returns the new lease's sequence, or ErrLeaseHeld.
// Renewing is writing again with the sequence of one's own lease.
func (s *PlanStore) WriteLease(ctx context.Context, name string, l *bus.Lease, expect uint64) (uint64, error) {
	data, err := json.Marshal(l)
	if err != nil {
		return 0, fmt.Errorf("write lease %s: %w", name, err)
	}
	ttl := time.Duration(l.TTLSeconds * float64(time.Second))
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: bus.LeaseSubject(name), Data: data},
		jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(ttl))
	if bus.IsWrongLast(err) {
		return 0, fmt.Errorf("write lease %s: %w", name, bus.ErrLeaseHeld)
	}
	if err != nil {
		return 0, fmt.Errorf("write lease %s: %w", name, err)
	}
	return ack.Sequence, nil
}

// ReleaseLease gives up the lease at seq (a clean shutdown), so that a
// standby need not wait for it to lapse: it purges the lease subject,
// this holder's earlier renewals (still within their TTL) with it.
// Someone else's lease is left alone: its sequence differs.
func (s *PlanStore) ReleaseLease(ctx context.Context, name string, seq uint64) error {
	st, err := s.js.Stream(ctx, client.PlansStream)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.LeaseSubject(name))
	if err != nil || m.Sequence != seq {
		return nil // lapsed or taken over: not ours to release
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(bus.LeaseSubject(name))); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// LastMessage is where a subject's last message sits in the plan stream
// and the revision its header names (0: none), which tells a message
// apart from one at the same sequence of a stream made again since.
type LastMessage struct {
	Seq      uint64
	Revision int
}

// LastEvent is the last message on subject as the stream's leader has
// it (zero: none). Direct gets may be answered by a replica that lags;
// a planner that just took the lease asks the leader what the last
// revision is, so that it continues from it.
func (s *PlanStore) LastEvent(ctx context.Context, subject string) (LastMessage, error) {
	m, err := leaderGet(ctx, s.js, client.PlansStream, map[string]string{"last_by_subj": subject})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return LastMessage{}, nil
	case err != nil:
		return LastMessage{}, fmt.Errorf("last message of %s: %w", subject, err)
	}
	return LastMessage{Seq: m.Seq, Revision: headerRevision(m.Header)}, nil
}

// headerRevision is the revision header of a message's encoded headers
// (0 when it has none, or they do not parse).
func headerRevision(hdr []byte) int {
	if len(hdr) == 0 {
		return 0
	}
	h, err := nats.DecodeHeadersMsg(hdr)
	if err != nil {
		return 0
	}
	rev, err := strconv.Atoi(h.Get(client.RevisionHeader))
	if err != nil {
		return 0
	}
	return rev
}
