package service

import (
	"context"
	"fmt"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// Validate implements bus.Answerer: spec planned afresh on the live
// inventory, nothing published.
func (p *Planner) Validate(_ context.Context, data []byte) (*bus.ValidateReply, error) {
	spec, err := planner.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %w", bus.ErrBadRequest, err)
	}
	p.mu.Lock()
	nodes := p.live.planNodes()
	p.mu.Unlock()
	doc, _ := planner.Compute(spec, nodes)
	doc.Name = p.cfg.Plan
	doc.CreatedAt = p.cfg.Now().UTC()
	doc.Reason = "validation: not published"
	return &bus.ValidateReply{Document: &doc.Document, Nodes: len(nodes)}, nil
}

// Plan implements bus.Answerer: the latest revision from memory, other
// plans and older revisions rebuilt from the stream.
func (p *Planner) Plan(ctx context.Context, req bus.PlanRequest) (*planner.Plan, error) {
	name := req.Plan
	if name == "" {
		name = p.cfg.Plan
	}
	if err := bus.ValidatePlanName(name); err != nil {
		return nil, err
	}
	if req.Revision < 0 {
		return nil, fmt.Errorf("%w: revision %d: must be >= 1", bus.ErrBadRequest, req.Revision)
	}
	var sp *bus.StoredPlan
	p.mu.Lock()
	if name == p.cfg.Plan && p.latest != nil && (req.Revision == 0 || req.Revision == p.latest.Plan.Revision) {
		sp = p.latest
	}
	p.mu.Unlock()
	var err error
	switch {
	case sp != nil:
	case req.Revision == 0:
		sp, err = p.plans.Latest(ctx, name)
		if err == nil && sp == nil {
			err = fmt.Errorf("plan %s: %w (no revision published yet)", name, bus.ErrNotFound)
		}
	default:
		sp, err = p.plans.Revision(ctx, name, req.Revision)
	}
	if err != nil {
		return nil, err
	}
	return sp.Plan, nil
}
