package bus

import (
	"errors"
	"time"

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

// IsWrongLast is a publish refused because the subject's last sequence
// was not the expected one.
func IsWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
