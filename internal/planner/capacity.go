package planner

import (
	"fmt"
	"math"

	"github.com/poolplanner/poolplanner/plan"
)

// demandsDoc lists the spec's scheduling entries, in component order.
func (e *engine) demandsDoc() []plan.Demand { return demandsOf(e.spec) }

// demandsOf lists spec's scheduling entries, in component order.
func demandsOf(spec *Spec) []plan.Demand {
	sc := spec.Scheduling
	var out []plan.Demand
	add := func(c plan.Component, g *WorkerGroup) {
		if g != nil {
			out = append(out, plan.Demand{Component: c, Workers: g.WorkerNum, Auto: g.Auto, Min: g.Min, Max: g.Max, NumGPUs: g.NumGPUs, NumCPUs: g.NumCPUs})
		}
	}
	add(plan.Train, sc.Train)
	add(plan.Eval, sc.Eval)
	for i := range sc.Env {
		add(plan.Env, &sc.Env[i])
	}
	add(plan.Buffer, sc.Buffer)
	return out
}

// checkCapacity runs the arithmetic: CPUs always, GPUs and the size of
// multi-GPU workers in auto mode.
func (e *engine) checkCapacity() error {
	c := &e.cap
	for _, ns := range e.table {
		c.GPUsAvailable += len(ns.usable)
		c.CPUsAvailable += ns.cpusFree()
	}
	if err := e.arithmetic(len(e.table)); err != nil {
		return err
	}
	if e.rules.manual {
		return nil
	}
	return e.checkWorkerSize()
}

// arithmetic is checkCapacity's sums of what the spec needs against
// what e.cap says is available (on nodes nodes).
func (e *engine) arithmetic(nodes int) error {
	c := &e.cap
	for _, d := range e.demands {
		for _, g := range d.groups {
			c.CPUsRequired += float64(g.WorkerNum) * g.NumCPUs
		}
	}
	if bf := e.spec.Scheduling.Buffer; e.hasBuffer {
		n := bf.WorkerNum
		if bf.Auto {
			n = 1
		}
		c.CPUsRequired += float64(n) * bf.NumCPUs
	}
	c.GPUsRequired = e.required()
	// No nodes at all (an empty inventory, a planner's first look): both
	// run short, and GPUs are what the spec is about.
	noGPUs := !e.rules.manual && nodes == 0 && c.GPUsRequired > 0
	if c.CPUsRequired > c.CPUsAvailable+eps && !noGPUs {
		return &PlanError{Msg: fmt.Sprintf("Insufficient CPUs: required %s, available %s", pyFloat(c.CPUsRequired), pyFloat(c.CPUsAvailable))}
	}
	if !e.rules.manual && c.GPUsRequired > float64(c.GPUsAvailable) {
		return &PlanError{Msg: fmt.Sprintf("Insufficient GPUs: required %s, available %d", pyFloat(c.GPUsRequired), c.GPUsAvailable)}
	}
	return nil
}

// cannotFitOn reports whether spec planned afresh on view v fails its
// capacity arithmetic (checkCapacity), read from the nodes alone,
// summed in the order a run sums them (by id), without a state for each.
func cannotFitOn(spec *Spec, v *nodeView) bool {
	nodes := v.base
	order, err := sortedNodes(nodes)
	if err != nil {
		return false // the run says why
	}
	e := newEngine(spec, Options{})
	for _, i := range order {
		n, m := &nodes[i], v.mark(i)
		for g := range n.GPUs {
			if m.usable(n, g) {
				e.cap.GPUsAvailable++
			}
		}
		e.cap.CPUsAvailable += m.cpusFree(n)
	}
	return e.arithmetic(len(nodes)) != nil
}

// required is rlightning's GPU arithmetic, with each component counted as
// the packing needs it.
func (e *engine) required() float64 {
	train := 0
	if e.demands[compTrain].asked > 0 {
		train = gpusNeeded(e.demands[compTrain].groups)
		if e.hasBuffer {
			train += bufferReserve(e.spec.Scheduling.Buffer)
		}
	}
	eval := gpusNeeded(e.demands[compEval].groups)
	env := gpusNeeded(e.demands[compEnv].groups)
	rollout := eval + env
	if e.rules.deviceColocate {
		rollout = max(eval, env)
	}
	if e.rules.colocate {
		return float64(max(train, rollout))
	}
	return float64(train + rollout)
}

// checkWorkerSize refuses a multi-GPU worker no node can hold, since a
// worker never spans nodes, and counts the nodes too small for it.
func (e *engine) checkWorkerSize() error {
	largest, largestID := 0, ""
	var healthiest *nodeState // the most healthy GPUs, held by other plans or not
	most := 0
	for _, ns := range e.table {
		if len(ns.usable) > largest {
			largest, largestID = len(ns.usable), ns.node.ID
		}
		if healthy := ns.node.GPUs - len(unhealthyOf(ns.node)); healthy > most && len(ns.mark().heldBy) > 0 {
			most, healthiest = healthy, ns
		}
	}
	for _, d := range e.demands {
		ci := d.ci
		for gi, g := range d.groups {
			k := int(math.Round(g.NumGPUs))
			if g.NumGPUs <= 1 || k <= largest || g.WorkerNum == 0 {
				continue
			}
			where := "no node has usable GPUs"
			if largestID != "" {
				where = fmt.Sprintf("the largest node, %s, has %d usable", largestID, largest)
			}
			if healthiest != nil && most >= k {
				// Room that plans sharing the cluster hold, not too few GPUs.
				where += fmt.Sprintf("; %s has %d healthy, %s", healthiest.node.ID, most, heldReason(healthiest))
			}
			for _, ns := range e.table {
				e.exhaust(ci, e.tooFew(ns, group{ci, gi}, k), ns.node.ID)
			}
			return &PlanError{Msg: fmt.Sprintf("Cannot place %s: each worker needs %d GPUs of one node, and %s", d.comp, k, where)}
		}
	}
	return nil
}

// shortfall is the error of a run that left workers unplaced, naming the
// first such component and why its candidates were excluded.
func (e *engine) shortfall() error {
	if b := e.why.bound; b != nil {
		d := e.demands[b.g.c]
		w := d.groups[b.g.i]
		return &PlanError{Msg: fmt.Sprintf("Cannot place %s: %d of %d workers placed; the next needs %s GPU and %s CPU; %s",
			d.comp, d.asked-d.left(), d.asked, pyNum(w.NumGPUs), pyNum(w.NumCPUs), b.rc)}
	}
	for _, d := range e.demands {
		ci := d.ci
		if d.done() {
			continue
		}
		g := d.group()
		msg := fmt.Sprintf("Cannot place %s: %d of %d workers placed; the next needs %s GPU and %s CPU",
			d.comp, d.asked-d.left(), d.asked, pyNum(g.NumGPUs), pyNum(g.NumCPUs))
		x := e.explainComp(ci, e.noteTallies())
		if s := x.ExcludedText(); s != "" {
			msg += "; " + s
		}
		return &PlanError{Msg: msg}
	}
	return nil
}

// leastGPUs is a lower bound of the GPUs any placement of spec's workers
// holds (HeldGPUs), read from the spec alone: a quota it exceeds refuses
// the spec before any room is looked for, so that why such a plan is
// refused does not follow what other plans hold. It must never exceed a
// placement's count, or a plan within its quota would be refused; so it
// counts only what every placement must hold, where required counts what
// the packing takes: a component's shares summed (a GPU holds at most a
// whole share of each component), but no fewer GPUs than the workers of
// any one group fit on, whole GPUs for a worker of several; components
// that may share a GPU (colocate, device-colocate) counted as the larger.
// A buffer's reserve is left out (a valid plan may keep fewer of it), and
// so is a manual spec, whose GPUs are the user's ranges.
func leastGPUs(spec *Spec) int {
	r := newRules(spec.Placement)
	if r.manual {
		return 0
	}
	sc := &spec.Scheduling
	train := leastOf(groupList(sc.Train))
	eval, env := leastOf(groupList(sc.Eval)), leastOf(sc.Env)
	rollout := eval + env
	if r.deviceColocate {
		rollout = max(eval, env)
	}
	if r.colocate {
		return max(train, rollout)
	}
	return train + rollout
}

// leastOf is leastGPUs for one component's groups.
func leastOf(groups []WorkerGroup) int {
	whole, fit := 0, 0
	shares := 0.0
	for _, g := range groups {
		w := g.WorkerNum
		switch {
		case w <= 0 || g.NumGPUs <= eps:
			// A share of eps or less fits beside whatever its
			// component holds on a GPU (fits: up to 1+eps): it may take
			// no GPU of its own.
		case g.NumGPUs > 1:
			whole += w * int(math.Round(g.NumGPUs))
		default:
			shares += float64(w) * g.NumGPUs
			// fits lets a GPU take shares up to 1+eps; the wider
			// margin keeps per from falling short by a rounding.
			per := int((1 + 2*eps) / g.NumGPUs)
			fit = max(fit, (w+per-1)/per)
		}
	}
	return whole + max(fit, int(math.Ceil(shares/(1+eps)-eps)))
}
