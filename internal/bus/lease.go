package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaseSubjectPrefix prefixes the subject of a plan's planner lease,
// poolplanner.leases.NAME. It lives in the plan stream so that a
// revision's publish can check, in the same stream, that its planner
// still holds the lease (Nats-Expected-Last-Subject-Sequence-Subject): a
// planner that lost its lease while paused cannot publish when it
// wakes, whatever it thinks.
const LeaseSubjectPrefix = "poolplanner.leases."

// LeaseName is the lease every planner of a cluster contends for: its
// holder plans every plan. (Named as the one plan's lease was before
// several plans, so that planners of either kind share it.)
const LeaseName = "default"

// LeaseSubject is the subject of plan name's lease.
func LeaseSubject(name string) string { return LeaseSubjectPrefix + name }

// Lease is the message a leading planner keeps on its plan's lease
// subject, renewed before its TTL runs out. The message's stream
// sequence is the lease's fencing token.
type Lease struct {
	// Holder is the planner instance (its PlannerHeader id).
	Holder string `json:"holder"`
	// Host and PID say where it runs, for people.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Since is when this holder took the lease; Renewed, this renewal.
	Since   time.Time `json:"since"`
	Renewed time.Time `json:"renewed"`
	// TTLSeconds is how long the lease lasts unrenewed.
	TTLSeconds float64 `json:"ttl_seconds"`
	// Problems are what the holder finds wrong (a spec it cannot read,
	// replans failing), one line each; none when all is well.
	Problems []string `json:"problems,omitempty"`
	// Seq is the message's stream sequence (not in the body).
	Seq uint64 `json:"-"`
}

// Expires is when the lease lapses unless renewed.
func (l *Lease) Expires() time.Time {
	return l.Renewed.Add(time.Duration(l.TTLSeconds * float64(time.Second)))
}

// ErrLeaseLost is PublishEvent's answer when the publisher's lease is no
// longer the plan's lease: it lapsed, or another planner took it.
var ErrLeaseLost = errors.New("this planner no longer holds the plan's lease")

// ErrLeaseHeld is AcquireLease's answer when the lease is not at the
// expected sequence: another planner holds it, or took it over.
var ErrLeaseHeld = errors.New("the lease is held by another planner")

// ReadLease reads plan name's lease; nil and no error when nobody holds
// it.
func (s *PlanStore) ReadLease(ctx context.Context, name string) (*Lease, error) {
	st, err := s.js.Stream(ctx, PlansStream)
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, LeaseSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", name, err)
	}
	var l Lease
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
func (s *PlanStore) WriteLease(ctx context.Context, name string, l *Lease, expect uint64) (uint64, error) {
	data, err := json.Marshal(l)
	if err != nil {
		return 0, fmt.Errorf("write lease %s: %w", name, err)
	}
	ttl := time.Duration(l.TTLSeconds * float64(time.Second))
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: LeaseSubject(name), Data: data},
		jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(ttl))
	if isWrongLast(err) {
		return 0, fmt.Errorf("write lease %s: %w", name, ErrLeaseHeld)
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
	st, err := s.js.Stream(ctx, PlansStream)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, LeaseSubject(name))
	if err != nil || m.Sequence != seq {
		return nil // lapsed or taken over: not ours to release
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(LeaseSubject(name))); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// LastSeq is the stream sequence of the last message on subject as the
// stream's leader has it (0: none). Direct gets may be answered by a
// replica that lags; a planner that just took the lease asks the leader
// what the last revision is, so that it continues from it.
func (s *PlanStore) LastSeq(ctx context.Context, subject string) (uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	msg, err := s.js.Conn().RequestWithContext(ctx, s.apiPrefix()+"STREAM.MSG.GET."+PlansStream, req)
	if err != nil {
		return 0, fmt.Errorf("last message of %s: %w", subject, err)
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("last message of %s: %w", subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil
	case resp.Error != nil:
		return 0, fmt.Errorf("last message of %s: %w", subject, resp.Error)
	case resp.Message == nil:
		return 0, fmt.Errorf("last message of %s: empty reply", subject)
	}
	return resp.Message.Seq, nil
}

func (s *PlanStore) apiPrefix() string {
	if p := s.js.Options().APIPrefix; p != "" {
		return p
	}
	return jetstream.DefaultAPIPrefix
}

// isWrongLast is a publish refused because the subject's last sequence
// was not the expected one.
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
