package client

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// Summarized is plan name's latest revision as a listing of plans needs
// it: the event's header and the plan's summary (its workers and the
// GPUs they use on each node), without the placement.
type Summarized struct {
	Header  plan.Header
	Summary *plan.Summary
	// Seq is the stream sequence of the revision's event.
	Seq uint64
	// Whole says the revision was rebuilt whole to be summarized: its
	// event carries it whole (a small plan), or no summary of its chain's
	// base is stored (a planner from before summaries published it, or
	// the planner has not stored it yet).
	Whole bool
}

// maxSummary bounds a summary object's expanded size: a summary of a
// million nodes with ids that fold into no run is about 50 MB.
const maxSummary = 256 << 20

// Summary reads plan name's latest revision as Summarized, without
// rebuilding its placement where it can: a plan of 400,000 workers
// costs tens of kilobytes to list, not its rebuild. The planner stores
// a summary of each snapshot revision (SummaryObject in the plans
// bucket, matched to the snapshot's event by sequence); a later
// revision's summary is that one with the nodes of each change event
// after it set again, each event carrying its changed nodes whole.
// Where that cannot be read it rebuilds the revision as Plan does and
// summarizes that. ErrNotFound when the plan has no revision.
func (c *Client) Summary(ctx context.Context, name string) (*Summarized, error) {
	st, err := c.plans(ctx)
	if err != nil {
		return nil, err
	}
	m, err := lastEvent(ctx, st, name)
	if err != nil {
		return nil, err
	}
	ev, err := decodeEvent(m)
	if err != nil {
		return nil, err
	}
	if ev.Kind() != "document" {
		if s, ok := c.chainSummary(ctx, st, name, m, ev); ok {
			return &Summarized{Header: ev.Header, Summary: s, Seq: m.Sequence}, nil
		}
	}
	r, err := c.rebuild(ctx, st, name, m)
	if err != nil {
		return nil, err
	}
	return &Summarized{Header: r.Document.Header, Summary: plan.SummaryOf(r.Document, r.Seq), Seq: r.Seq, Whole: true}, nil
}

// chainSummary is the summary of event m (ev): its base's stored
// summary and the change events from there to m; false when any of it
// is missing or does not fit (the caller rebuilds instead).
func (c *Client) chainSummary(ctx context.Context, st jetstream.Stream, name string, m *jetstream.RawStreamMsg, ev *plan.Event) (*plan.Summary, bool) {
	base := m
	if ev.Kind() == "change" {
		if ev.Base >= ev.Revision || ev.Base < 1 {
			return nil, false
		}
		var err error
		if base, err = eventAt(ctx, st, name, ev.Base); err != nil {
			return nil, false
		}
	}
	var s plan.Summary
	if err := c.getObject(ctx, PlansBucket, wire.SummaryObject(name), maxSummary, &s); err != nil ||
		s.Seq != base.Sequence || s.Name != name || s.Revision != ev.Base {
		return nil, false
	}
	if base == m {
		return &s, s.Each(func(string, int, []plan.Range) bool { return true }) == nil
	}
	var b plan.SummaryBuilder
	var gpus []int
	err := s.Each(func(node string, workers int, rs []plan.Range) bool {
		gpus = gpus[:0]
		for _, r := range rs {
			for g := r.First; g <= r.Last; g++ {
				gpus = append(gpus, g)
			}
		}
		b.Set(node, workers, gpus)
		return true
	})
	if err != nil {
		return nil, false
	}
	// The chain as rebuild reads it: each change event after the base,
	// the next revision, ending at m.
	rev := ev.Base
	for seq := base.Sequence + 1; rev < ev.Revision; {
		next, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(PlanEventSubject(name)))
		if err != nil {
			return nil, false
		}
		e, err := decodeEvent(next)
		if err != nil || e.Kind() != "change" || e.Base != ev.Base || e.Revision != rev+1 || next.Sequence > m.Sequence {
			return nil, false
		}
		for _, n := range e.Change.Nodes {
			gpus = gpus[:0]
			for _, w := range n.Workers {
				gpus = append(gpus, w.GPUs...)
			}
			b.Set(n.NodeID, len(n.Workers), gpus)
		}
		rev, seq = e.Revision, next.Sequence+1
	}
	return b.Summary(name, ev.Revision, m.Sequence), true
}
