package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/wire"
)

// readAssignment decodes node's assignment message of plan name,
// fetching it from its object (that node's, at most MaxDecoded bytes)
// when it was too large for one.
func (c *Client) readAssignment(ctx context.Context, name, node string, seq uint64, data []byte, h nats.Header) (*Assignment, error) {
	a := Assignment{Seq: seq}
	rule := objectRule{bucket: PlansBucket, prefix: wire.AssignmentObjectPrefix(name, node), limit: wire.MaxDecoded}
	if err := c.decodeBody(ctx, data, h, &a, rule); err != nil {
		return nil, fmt.Errorf("assignment of plan %s node %s at %d: %w", name, node, seq, err)
	}
	// The subject says whose it is, whatever the body claims.
	a.Seq, a.Plan, a.NodeID = seq, name, node
	if a.Workers == nil {
		a.Workers = []PlacedWorker{}
	}
	return &a, nil
}

// Assignment is node's workers of plan name as its assignment subject
// last had them; ErrNotFound when it has had none.
func (c *Client) Assignment(ctx context.Context, name, node string) (*Assignment, error) {
	st, err := c.js.Stream(ctx, AssignmentsStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", AssignmentsStream, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, AssignmentSubject(name, node))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("plan %s node %s: %w", name, node, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("plan %s node %s: %w", name, node, err)
	}
	return c.readAssignment(ctx, name, node, m.Sequence, m.Data, m.Header)
}

// FollowNode delivers node's workers of plan name as its assignment
// subject has them now (if it has had any), then every change, until ctx
// is done; the channel is then closed. A launcher on a node follows this:
// it costs only its own node's changes. Revisions delivered never go
// back (an older revision's message, published late, is skipped), and
// messages that cannot be read are skipped.
func (c *Client) FollowNode(ctx context.Context, name, node string) (<-chan *Assignment, error) {
	cons, err := c.js.OrderedConsumer(ctx, AssignmentsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{AssignmentSubject(name, node)},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow plan %s node %s: %w", name, node, err)
	}
	it, err := cons.Messages(wire.FollowHeartbeat()...)
	if err != nil {
		c.dropConsumer(AssignmentsStream, cons)
		return nil, fmt.Errorf("follow plan %s node %s: %w", name, node, err)
	}
	out := make(chan *Assignment, 4)
	go func() {
		defer close(out)
		defer c.dropConsumer(AssignmentsStream, cons)
		stop := context.AfterFunc(ctx, it.Stop)
		defer stop()
		last := 0
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			var seq uint64
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			a, err := c.readAssignment(ctx, name, node, seq, m.Data(), m.Headers())
			if err != nil || a.Revision < last {
				continue
			}
			last = a.Revision
			if !send(ctx, out, a) {
				return
			}
		}
	}()
	return out, nil
}

// Assignments calls fn with the last assignment of every node of plan
// name, until fn returns false; a planner checks them against its plan at
// start. A message it cannot read comes with Err set and no workers. It
// reads them with a consumer it deletes when done: one pass, where a
// direct get per node costs a round trip each and the stream's subject
// listing is one message of 46 bytes a node (4.6 MB at 100,000 nodes).
// Where the stream's consumers are at their cap (launchers may fill the
// assignment stream's, and the planner must still check), it reads them
// without one: the stream's subjects, then a direct get of each
// subject's last message.
func (c *Client) Assignments(ctx context.Context, name string, fn func(*Assignment) bool) error {
	st, err := c.js.Stream(ctx, AssignmentsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", AssignmentsStream, err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{AssignmentSubjectPrefix + name + ".>"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		return c.assignmentsDirect(ctx, st, name, fn)
	}
	if err != nil {
		return fmt.Errorf("assignments of plan %s: %w", name, err)
	}
	defer c.dropConsumer(AssignmentsStream, cons)
	info := cons.CachedInfo()
	if info == nil || info.NumPending == 0 {
		return nil
	}
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(min(int(left), 1024), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("assignments of plan %s: %w", name, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			left--
			if !fn(c.assignmentOf(ctx, name, m)) {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("assignments of plan %s: %w", name, err)
		}
		if n == 0 {
			return nil
		}
	}
	return nil
}

// assignmentsDirect is Assignments without a consumer.
func (c *Client) assignmentsDirect(ctx context.Context, st jetstream.Stream, name string, fn func(*Assignment) bool) error {
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(AssignmentSubjectPrefix+name+".>"))
	if err != nil {
		return fmt.Errorf("assignments of plan %s: %w", name, err)
	}
	for _, subject := range slices.Sorted(maps.Keys(info.State.Subjects)) {
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // dropped meanwhile
		}
		if err != nil {
			return fmt.Errorf("assignments of plan %s: %w", name, err)
		}
		if !fn(c.assignmentFrom(ctx, name, subject, m.Sequence, m.Data, m.Header)) {
			return nil
		}
	}
	return nil
}

// assignmentOf reads one message of Assignments.
func (c *Client) assignmentOf(ctx context.Context, name string, m jetstream.Msg) *Assignment {
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	return c.assignmentFrom(ctx, name, m.Subject(), seq, m.Data(), m.Headers())
}

// assignmentFrom reads the assignment message of subject (stream
// sequence seq): one it cannot read comes with Err set and no workers.
func (c *Client) assignmentFrom(ctx context.Context, name, subject string, seq uint64, data []byte, h nats.Header) *Assignment {
	node := AssignmentNode(name, subject)
	a, err := c.readAssignment(ctx, name, node, seq, data, h)
	if err != nil {
		return &Assignment{Plan: name, NodeID: node, Workers: []PlacedWorker{}, Seq: seq, Err: err}
	}
	return a
}
