package service

import (
	"cmp"
	"context"
	"fmt"
	"maps"
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

// Validate implements api.Answerer: spec as the replan would place
// it, nothing published. A spec that fits is answered with what the
// replan would publish: the same engine call as the loop's
// (planner.PlanAllWith with its growth options, spec added as a new
// plan or, as an existing plan's new spec (as), in place of its spec
// with the plan's latest revision as the preference), so its sizes are
// the next revision's, an elastic plan of its priority gives up
// surplus for it, and its moved count is the revision's. One that does
// not fit is refused as planned afresh on what the plans of its
// priority or higher leave of the live inventory (lower ones would give
// way; elastic ones at their minimum), which says whose room it lacks.
// (The service runs one validation at a time: a micro endpoint handles
// its requests in turn.)
func (p *Service) Validate(ctx context.Context, data []byte, as string) (*client.ValidateReply, error) {
	spec, err := planner.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %w", client.ErrBadRequest, err)
	}
	if p.ready != nil {
		select {
		case <-p.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: this planner is starting: it has not read the inventory and the specs yet; ask again in a moment", client.ErrInternal)
		}
	}
	sn := p.withStreamLatest(ctx, p.view())
	nodes := sn.nodes
	var others []planner.Job
	for _, s := range sn.planned() {
		if s.name != as && s.latest != nil && !s.removing {
			others = append(others, planner.Job{Name: s.name, Spec: s.spec, Prev: s.latest.Plan})
		}
	}
	var reply plan.Document
	if next := replanAs(sn, as, spec, sn.grow.options(p.clock.Now(), p.cfg.GrowAfter)); next != nil {
		reply = next.Document
		if planner.IsElastic(spec) {
			reply.Warnings = append(slices.Clone(reply.Warnings), planner.ElasticWarning(spec, next, nodes))
		}
	} else {
		doc, _ := planner.PlanBeside(spec, nodes, others)
		reply = doc.Document
		if !reply.Valid() && len(others) > 0 {
			reply.Error = whyNotBeside(doc, spec, nodes, others, reply.Error)
		}
	}
	reply.Name = cmp.Or(as, "(new plan)")
	reply.Revision = 0
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

// withStreamLatest is sn with the latest revision of each planned plan
// it has none of read from the stream, as Plan (a lookup) answers: the
// loop records a revision it published, and publishes the snapshot,
// only once the stream acked it and its own files are written, so a
// lookup may answer revision 1 while the snapshot still has none, and
// a validation asked next must not plan beside a plan that holds
// nothing (TestValidateSeesWhatLookupSaw). sn itself is not changed;
// without a stream, or when the read fails, sn as it is.
func (p *Service) withStreamLatest(ctx context.Context, sn *snapshot) *snapshot {
	if p.plans == nil {
		return sn
	}
	out := sn
	for _, v := range sn.planned() {
		if v.latest != nil || v.removing {
			continue
		}
		rctx, done := context.WithTimeout(ctx, p.cfg.StoreTimeout)
		sp, err := p.plans.Latest(rctx, v.name)
		done()
		if err != nil || sp == nil {
			continue
		}
		if out == sn {
			c := *sn
			c.plans = maps.Clone(sn.plans)
			out = &c
		}
		v.latest = sp
		out.plans[v.name] = v
	}
	return out
}

// replanAs is what the replan would make of spec as plan as's stored
// spec, when spec fits in full (valid, nothing pending): the jobs the
// loop's replan gives planner.PlanAllWith (releaseRemoved) with opt,
// the loop's growth options, and as's spec replaced, or spec added as
// the youngest plan when as has none in the replan (a new plan, "" or
// one being removed). nil otherwise: the refusal is then worded as a
// validation's (PlanBeside), which says whose room it lacks.
func replanAs(sn *snapshot, as string, spec *planner.Spec, opt planner.ElasticOptions) *planner.Plan {
	var jobs []planner.Job
	at := -1
	var age uint64
	for _, s := range sn.planned() {
		age = max(age, s.age)
		if s.removing {
			continue
		}
		var prev *planner.Plan
		if s.latest != nil && !s.latest.Unreadable {
			prev = s.latest.Plan
		}
		switch {
		case as != "" && s.name == as:
			at = len(jobs)
			jobs = append(jobs, planner.Job{Name: s.name, Spec: spec, Prev: prev, Age: s.age})
		case s.spec == nil:
			if prev != nil && prev.Placed() {
				jobs = append(jobs, planner.Job{Name: s.name, Prev: prev, Age: s.age})
			}
		default:
			jobs = append(jobs, planner.Job{Name: s.name, Spec: s.spec, Prev: prev, Age: s.age})
		}
	}
	if at < 0 {
		// Its first spec revision comes after every stored one's.
		at = len(jobs)
		jobs = append(jobs, planner.Job{Name: cmp.Or(as, "(new plan)"), Spec: spec, Age: age + 1})
	}
	o := planner.PlanAllWith(jobs, sn.nodes, opt)[at]
	if o.Err != nil || o.Plan.PendingSpec != nil || !o.Plan.Valid() {
		return nil
	}
	return o.Plan
}

// whyNotBeside says first whether spec could fit the cluster at all,
// and, if it could, which plans hold the room it lacks (beside: the
// error planned beside them, doc its plan). An error of the spec's own,
// its quota above all, is never put down to others.
func whyNotBeside(doc *planner.Plan, spec *planner.Spec, nodes []planner.Node, others []planner.Job, beside string) string {
	if doc.Status.Reason == plan.ReasonQuota {
		return beside
	}
	alone, err := planner.Compute(spec, nodes)
	if err != nil {
		return "it cannot fit this cluster at all, whatever other plans hold: " + err.Error()
	}
	if o := planner.WithinQuota(planner.Outcome{Plan: alone}, spec); o.Err != nil {
		// It would fit the cluster alone, but not within its quota: its
		// own limit, whatever the others hold.
		return o.Err.Error()
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

// Plan implements api.Answerer: the latest revision from memory, other
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
		if s := sn.plans[n]; s.latest != nil && !s.latest.Unreadable && !s.latest.Plan.Removed() {
			out = append(out, s.latest.Plan)
		}
	}
	return out
}

// Inventory is the live inventory's documents, for the GPU map.
func (p *Service) Inventory() []inventory.NodeInventory {
	return slices.Clone(p.view().docs)
}

// UnplannedUse is the GPUs of the live inventory that run processes
// though no worker of the plans' latest revisions is placed on them,
// for the gauge serve's metrics count: read from one snapshot in place,
// not from a copy of its 20,000 documents per scrape as Inventory gives
// the GPU map.
func (p *Service) UnplannedUse() []inventory.UnplannedGPU {
	sn := p.view()
	var docs []*plan.Document
	for _, n := range sn.names {
		if s := sn.plans[n]; s.latest != nil && !s.latest.Unreadable && !s.latest.Plan.Removed() {
			docs = append(docs, &s.latest.Plan.Document)
		}
	}
	return inventory.UnplannedIn(sn.docs, docs...)
}
