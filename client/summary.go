package client

import (
	"context"

	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// Summarized is plan name's latest revision as a listing of plans needs
// it: the event's header and the plan's summary (its worker count and
// the GPUs it uses on each node), without the placement.
type Summarized struct {
	Header  plan.Header
	Summary *plan.Summary
	// Seq is the stream sequence of the revision's event.
	Seq uint64
	// Whole says the revision was rebuilt whole to be summarized: its
	// event carries it whole (a small plan), or no summary of that event
	// is stored (a planner from before summaries published it, or the
	// planner has not stored it yet).
	Whole bool
}

// maxSummary bounds a summary object's expanded size: a summary of a
// million nodes with ids that fold into no run is about 40 MB.
const maxSummary = 256 << 20

// Summary reads plan name's latest revision as Summarized: its event,
// and the summary the planner stored of that event (the object
// SummaryObject in the plans bucket, matched by the event's sequence),
// so that a plan of 400,000 workers costs a few kilobytes to list, not
// its rebuild. Where no summary of the latest event can be read it
// rebuilds the revision as Plan does and summarizes that. ErrNotFound
// when the plan has no revision.
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
		var s plan.Summary
		err := c.getObject(ctx, PlansBucket, wire.SummaryObject(name), maxSummary, &s)
		if err == nil && s.Seq == m.Sequence && s.Name == name && s.Revision == ev.Revision && s.Each(func(string, []plan.Range) bool { return true }) == nil {
			return &Summarized{Header: ev.Header, Summary: &s, Seq: m.Sequence}, nil
		}
	}
	r, err := c.rebuild(ctx, st, name, m)
	if err != nil {
		return nil, err
	}
	return &Summarized{Header: r.Document.Header, Summary: plan.SummaryOf(r.Document, r.Seq), Seq: r.Seq, Whole: true}, nil
}
