package service

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// ValidateMaxWorkers bounds the placement a validate reply carries: a
// plan of more workers is validated whole, but the reply leaves out its
// workers and pools (hundreds of MB of JSON at a million workers) and
// says so in warnings; resource_pool, the reasons and the arithmetic
// stay.
const ValidateMaxWorkers = 100_000

// Validate implements store.Answerer: spec planned afresh on what the
// plans of its priority or higher leave of the live inventory (lower
// ones would give way), nothing published. (The service runs one
// validation at a time: a micro endpoint handles its requests in turn.)
func (p *Service) Validate(_ context.Context, data []byte, as string) (*client.ValidateReply, error) {
	spec, err := planner.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %w", client.ErrBadRequest, err)
	}
	sn := p.view()
	nodes := sn.nodes
	var others []planner.Job
	for _, s := range sn.planned() {
		if s.name != as && s.latest != nil && !s.removing {
			others = append(others, planner.Job{Name: s.name, Spec: s.spec, Prev: s.latest.Plan})
		}
	}
	doc, _ := planner.PlanBeside(spec, nodes, others)
	reply := doc.Document
	if !reply.Valid && len(others) > 0 {
		reply.Error = whyNotBeside(spec, nodes, others, reply.Error)
	}
	reply.Name = cmp.Or(as, "(new plan)")
	reply.CreatedAt = p.cfg.Now().UTC()
	reply.Reason = "validation: not published"
	if n := reply.Workers.Len(); n > ValidateMaxWorkers {
		reply.Workers, reply.Pools, reply.Notes = plan.NewWorkers(nil), []plan.Pool{}, nil
		reply.Warnings = append(slices.Clone(reply.Warnings), fmt.Sprintf(
			"workers and pools left out of this reply: %d workers, over %d; planner plan prints them offline, and the published plan carries them", n, ValidateMaxWorkers))
		// The plan just made is garbage once the reply is sent: give its
		// memory back rather than keep it for the next large request.
		time.AfterFunc(time.Second, debug.FreeOSMemory)
	}
	return &client.ValidateReply{Document: &reply, Nodes: len(nodes)}, nil
}

// whyNotBeside says first whether spec could fit the cluster at all,
// and, if it could, which plans hold the room it lacks (beside: the
// error planned beside them).
func whyNotBeside(spec *planner.Spec, nodes []planner.Node, others []planner.Job, beside string) string {
	if _, err := planner.Compute(spec, nodes); err != nil {
		return "it cannot fit this cluster at all, whatever other plans hold: " + err.Error()
	}
	var holders []string
	for _, o := range others {
		if o.Prev != nil && o.Prev.Placed() && o.Prev.GPUsHeld > 0 && o.Prev.Priority >= spec.Priority {
			holders = append(holders, fmt.Sprintf("%s (priority %d, %d GPUs)", o.Name, o.Prev.Priority, o.Prev.GPUsHeld))
		}
	}
	if len(holders) == 0 {
		return beside
	}
	return fmt.Sprintf("it would fit the cluster, but plans of its priority or higher hold the room it lacks: %s: %s", strings.Join(holders, ", "), beside)
}

// Plan implements store.Answerer: the latest revision from memory, other
// plans and older revisions rebuilt from the stream.
func (p *Service) Plan(ctx context.Context, req wire.PlanRequest) (*planner.Plan, error) {
	name := req.Plan
	if name == "" {
		name = p.cfg.Plan
	}
	if err := store.ValidatePlanName(name); err != nil {
		return nil, err
	}
	if req.Revision < 0 {
		return nil, fmt.Errorf("%w: revision %d: must be >= 1", client.ErrBadRequest, req.Revision)
	}
	var sp *store.StoredPlan
	if s, ok := p.view().plans[name]; ok && s.latest != nil && (req.Revision == 0 || req.Revision == s.latest.Plan.Revision) {
		sp = s.latest
	}
	var err error
	switch {
	case sp != nil:
	case req.Revision == 0:
		sp, err = p.plans.Latest(ctx, name)
		if err == nil && sp == nil {
			err = fmt.Errorf("plan %s: %w (no revision published yet)", name, client.ErrNotFound)
		}
	default:
		sp, err = p.plans.Revision(ctx, name, req.Revision)
	}
	if err != nil {
		return nil, err
	}
	return sp.Plan, nil
}

// Plans is every plan's latest revision (of those with one), for the GPU
// map.
func (p *Service) Plans() []*planner.Plan {
	var out []*planner.Plan
	sn := p.view()
	for _, n := range sn.names {
		if s := sn.plans[n]; s.latest != nil && !s.latest.Unreadable && !s.latest.Plan.Removed {
			out = append(out, s.latest.Plan)
		}
	}
	return out
}

// Inventory is the live inventory's documents, for the GPU map.
func (p *Service) Inventory() []inventory.NodeInventory {
	return slices.Clone(p.view().docs)
}
