// Package api answers the micro service's requests (validate, plan,
// lookup): the rules a request must meet, the words of its refusals and
// the kind each error travels as. The service answers what it holds
// (Answerer); package store persists and never answers.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// Answerer is what the service asks; the planner service implements it.
type Answerer interface {
	// Validate plans spec as plan would be (its own GPUs not in the way;
	// "" for a plan not yet stored).
	Validate(ctx context.Context, spec []byte, plan string) (*client.ValidateReply, error)
	Plan(ctx context.Context, req wire.PlanRequest) (*planner.Plan, error)
}

// Endpoints answers the micro service's endpoints (bus.AddService) from
// a: validate and plan as a answers them, lookups read off the plan a
// gives. An Answerer that is a bus.RequestObserver stays one.
func Endpoints(a Answerer) bus.Handlers {
	if o, ok := a.(bus.RequestObserver); ok {
		return observed{endpoints{a}, o}
	}
	return endpoints{a}
}

type endpoints struct{ a Answerer }

type observed struct {
	endpoints
	bus.RequestObserver
}

// Validate checks the plan name the request's header gives, then asks.
func (e endpoints) Validate(ctx context.Context, spec []byte, name string) (any, error) {
	if name != "" {
		if err := store.ValidatePlanName(name); err != nil {
			return nil, fmt.Errorf("%s header: %w", client.PlanHeader, err)
		}
	}
	r, err := e.a.Validate(ctx, spec, name)
	if err != nil {
		return nil, kinded(err)
	}
	return r, nil
}

// Plan answers with the plan document.
func (e endpoints) Plan(ctx context.Context, req wire.PlanRequest) (any, error) {
	p, err := e.a.Plan(ctx, req)
	if err != nil {
		return nil, kinded(err)
	}
	return &p.Document, nil
}

// kinded marks the planner's errors with their kind on the wire: a
// spec's field is a bad request, a plan that cannot be made infeasible.
func kinded(err error) error {
	var fe *planner.FieldError
	var pe *planner.PlanError
	switch {
	case errors.Is(err, client.ErrBadRequest), errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrInfeasible):
		return err
	case errors.As(err, &fe):
		return bus.Kind(client.ErrBadRequest, err)
	case errors.As(err, &pe):
		return bus.Kind(client.ErrInfeasible, err)
	}
	return err
}

// Place returns w of plan name's revision rev with its
// CUDA_VISIBLE_DEVICES value.
func Place(name string, rev int, w plan.Worker) client.PlacedWorker {
	return client.PlacedWorker{Worker: w, Plan: name, Revision: rev, CUDAVisibleDevices: wire.VisibleDevices(w)}
}

// Lookup answers a lookup request from the plan the Answerer gives: a
// worker (its JSON written here: lookups are the service's hottest
// reply) or a node's workers.
func (e endpoints) Lookup(ctx context.Context, req wire.LookupRequest) (any, error) {
	v, err := lookup(ctx, e.a, req)
	if err != nil {
		return nil, kinded(err)
	}
	if pw, ok := v.(client.PlacedWorker); ok {
		return json.RawMessage(pw.AppendJSON(make([]byte, 0, 512))), nil
	}
	return v, nil
}

func lookup(ctx context.Context, a Answerer, req wire.LookupRequest) (any, error) {
	byNode := req.NodeID != ""
	byWorker := req.Component != "" || req.Index != nil
	switch {
	case byNode && byWorker:
		return nil, fmt.Errorf("%w: give component and index, or node_id, not both", client.ErrBadRequest)
	case !byNode && (req.Component == "" || req.Index == nil):
		return nil, fmt.Errorf("%w: give component and index, or node_id", client.ErrBadRequest)
	case byWorker && *req.Index < 0:
		return nil, fmt.Errorf("%w: index %d: must be >= 0", client.ErrBadRequest, *req.Index)
	case byWorker && plan.Component(req.Component).Rank() < 0:
		return nil, fmt.Errorf("%w: component %s: want train, eval, env or buffer", client.ErrBadRequest, quoteClipped(req.Component))
	}
	if byNode {
		if err := inventory.ValidateNodeID(req.NodeID); err != nil {
			return nil, fmt.Errorf("%w: node_id: %w", client.ErrBadRequest, err)
		}
	}
	p, err := a.Plan(ctx, wire.PlanRequest{Plan: req.Plan, Revision: req.Revision})
	if err != nil {
		return nil, err
	}
	if !p.Placed() {
		return nil, fmt.Errorf("%w: plan %s revision %d is not valid: %s", client.ErrInfeasible, p.Name, p.Revision, p.Error)
	}
	if byNode {
		out := client.Assignment{Plan: p.Name, Revision: p.Revision, NodeID: req.NodeID, Workers: []client.PlacedWorker{}}
		for _, w := range p.OnNode(req.NodeID) {
			out.Workers = append(out.Workers, Place(p.Name, p.Revision, w))
		}
		return out, nil
	}
	if w := p.Workers.Find(plan.Component(req.Component), *req.Index); w != nil {
		return Place(p.Name, p.Revision, *w), nil
	}
	for _, u := range p.Unplaced {
		if string(u.Component) == req.Component && u.Index == *req.Index {
			where := ""
			if u.NodeID != "" {
				where = fmt.Sprintf("; it returns to node %s GPUs %v when they hold again", u.NodeID, u.GPUs)
			}
			return nil, fmt.Errorf("%w: plan %s revision %d is degraded: %s worker %d is unplaced: %s%s", client.ErrInfeasible, p.Name, p.Revision, req.Component, *req.Index, u.Reason, where)
		}
	}
	return nil, fmt.Errorf("%w: plan %s revision %d has no %s worker %d", client.ErrNotFound, p.Name, p.Revision, req.Component, *req.Index)
}

// quoteClipped quotes a value a requester sent for its error: at most
// 64 bytes of it, and its length when longer, so that a request of a
// megabyte's name is not answered with a megabyte (twice: micro's error
// header and the body both carry the description).
func quoteClipped(s string) string {
	const most = 64
	if len(s) <= most {
		return strconv.Quote(s)
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
