package planner

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// A plan that cannot place every worker names what binds: the constraint
// that rules out the nodes a group would need, found on the cluster as
// it is empty of the plan's workers, not the occupancy a greedy pass
// happened to leave. A group that cannot be placed even alone binds by
// its own constraints (binding); groups that each fit alone but not
// together bind by the constraints that make them compete (contention).

// binding is the reason a constrained plan fails: the group it concerns
// and the reason, with the nodes it concerns.
type binding struct {
	g  group
	rc plan.ReasonCount
}

// describe is c as a spec writes it, in short: "gpu_model [A100],
// gpu_link numa".
func describe(c *Constraints) string {
	if !c.any() {
		return ""
	}
	var parts []string
	if len(c.NodeSelector) > 0 {
		keys := slices.Sorted(maps.Keys(c.NodeSelector))
		kv := make([]string, len(keys))
		for i, k := range keys {
			kv[i] = k + "=" + c.NodeSelector[k]
		}
		parts = append(parts, "node_selector "+strings.Join(kv, ","))
	}
	if len(c.GPUModels) > 0 {
		parts = append(parts, fmt.Sprintf("gpu_model %v", c.GPUModels))
	}
	if c.MinGPUMemoryGB > 0 {
		parts = append(parts, fmt.Sprintf("min_gpu_memory_gb %g", c.MinGPUMemoryGB))
	}
	if c.GPULink != "" {
		parts = append(parts, "gpu_link "+c.GPULink)
	}
	if c.NVLinkDomain != "" {
		parts = append(parts, "nvlink_domain "+c.NVLinkDomain)
	}
	return strings.Join(parts, ", ")
}

// staticBinding is the first group, in the spec's order, that its own
// constraints keep from being placed even on the empty cluster, and the
// constraint that does: the first of node_selector, gpu_model and
// min_gpu_memory_gb, gpu_link, nvlink_domain strict under which its room
// falls short. nil when every group fits alone, or when one does not
// for want of GPUs or CPUs whatever its constraints (the arithmetic and
// the greedy error say that).
func (e *engine) staticBinding() *binding {
	for _, d := range e.demands {
		ci := d.ci
		for gi, w := range d.groups {
			g := group{ci, gi}
			if w.WorkerNum <= 0 || w.NumGPUs <= 0 || !e.con(g).any() {
				continue
			}
			if b := e.bindingOf(g, w.WorkerNum); b != nil {
				return b
			}
		}
	}
	return nil
}

// bindingOf finds the constraint that keeps n workers of group g from
// the empty cluster, nil if none does.
func (e *engine) bindingOf(g group, n int) *binding {
	var room [layerLink + 1]int
	var fit [layerLink + 1][]int32 // nodes with room, per layer
	for at, ns := range e.table {
		for l := layerSize; l <= layerLink; l++ {
			if r := e.emptyRoom(ns, g, l); r > 0 {
				room[l] += r
				fit[l] = append(fit[l], int32(at))
			}
		}
	}
	c := e.con(g)
	w := e.groupSpec(g)
	count := workerGPUs(w)
	if room[layerSize] < n {
		return nil
	}
	b := &binding{g: g}
	switch {
	case room[layerSelector] < n:
		b.rc = e.shortOf(c.nodeReason(), fit[layerSize], fit[layerSelector], room[layerSelector], n)
	case room[layerModel] < n:
		b.rc = e.shortOf(c.gpuReason(), fit[layerSelector], fit[layerModel], room[layerModel], n)
	case room[layerLink] < n:
		b.rc = e.linkShort(c, fit[layerModel], room[layerLink], n, count)
	case c.NVLinkDomain == DomainStrict:
		byDomain := map[string]int{}
		best := ""
		for _, at := range fit[layerLink] {
			ns := e.table[at]
			d := domainOf(ns)
			byDomain[d] += e.emptyRoom(ns, g, layerLink)
			if best == "" || byDomain[d] > byDomain[best] || byDomain[d] == byDomain[best] && d < best {
				best = d
			}
		}
		if byDomain[best] >= n {
			return nil
		}
		b.rc = plan.ReasonCount{Reason: fmt.Sprintf("nvlink_domain strict: no NVLink domain has room for all %d %s workers (the largest, %s, has room for %d)",
			n, g.c.Component(), strings.TrimPrefix(best, "node:"), byDomain[best])}
	default:
		return nil
	}
	return b
}

// shortOf is the reason a layer's constraint binds: none of the nodes
// before it (was) match it (reason, on the nodes it rules out), or those
// that do have room for fewer workers than asked.
func (e *engine) shortOf(reason string, was, is []int32, room, n int) plan.ReasonCount {
	if len(is) == 0 {
		rc := plan.ReasonCount{Reason: reason, Nodes: len(was)}
		for _, at := range was[:min(len(was), maxExamples)] {
			rc.NodeIDs = append(rc.NodeIDs, e.table[at].node.ID)
		}
		return rc
	}
	what := strings.TrimSuffix(strings.TrimSuffix(reason, " matches no healthy GPU"), " does not match the node's labels")
	return plan.ReasonCount{Reason: fmt.Sprintf("%s: the %d %s it allows %s room for %d of the %d workers",
		what, len(is), plural(len(is), "node", "nodes"), plural(len(is), "has", "have"), room, n)}
}

// linkShort is the reason gpu_link binds: the nodes of the models the
// group may use have no count GPUs so linked, or room for too few
// workers so linked.
func (e *engine) linkShort(c *Constraints, nodes []int32, room, n, count int) plan.ReasonCount {
	var models []string
	for _, at := range nodes {
		if m := shortModel(modelOf(e.table[at].node)); m != "" && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	of := "no node"
	if len(models) > 0 {
		of = "no node of model " + strings.Join(models, " or ")
	}
	linked := fmt.Sprintf("%d GPUs on one NUMA node", count)
	if c.GPULink == LinkNVLink {
		linked = fmt.Sprintf("%d NVLink-peer GPUs", count)
	}
	if room == 0 {
		return plan.ReasonCount{Reason: fmt.Sprintf("gpu_link %s: %s has %s", c.GPULink, of, linked)}
	}
	return plan.ReasonCount{Reason: fmt.Sprintf("gpu_link %s: the nodes %s have room for %d of the %d workers of %s",
		c.GPULink, strings.TrimPrefix(of, "no node "), room, n, linked)}
}

// contention is the binding of a plan whose groups each fit alone but
// not together, as the first order tried left it: the group that fell
// short first, and the other groups that hold GPUs on the nodes it may
// use, with their constraints.
func (e *engine) contention() *binding {
	g, found := group{}, false
	if e.failedUnit >= 0 && e.failedUnit < len(e.unitGroups) {
		g, found = e.unitGroups[e.failedUnit], true
	}
	for _, d := range e.demands {
		if !found && !d.done() {
			g, found = group{d.ci, d.gi}, true
		}
	}
	if !found {
		return nil
	}
	var mine []int32
	gpus := 0
	for at, ns := range e.table {
		if e.emptyRoom(ns, g, layerLink) > 0 {
			mine = append(mine, int32(at))
			gpus += len(ns.usable)
		}
	}
	held := e.heldOn(mine)
	var others []string
	for _, o := range slices.SortedFunc(maps.Keys(held), func(a, b group) int { return cmp.Or(cmp.Compare(a.c, b.c), cmp.Compare(a.i, b.i)) }) {
		if o == g {
			continue
		}
		what := fmt.Sprintf("%s's %d", e.groupName(o), int(math.Ceil(held[o]-eps)))
		if s := describe(e.con(o)); s != "" {
			what += " (" + s + ")"
		}
		others = append(others, what)
	}
	if len(others) == 0 {
		return nil
	}
	subject := describe(e.con(g))
	if subject == "" {
		subject = "without constraints"
	}
	need := gpusNeeded([]WorkerGroup{e.groupSpec(g)})
	return &binding{g: g, rc: plan.ReasonCount{Reason: fmt.Sprintf("%s: the %d %s it may use hold %d GPUs, too few for %s's %d beside %s",
		subject, len(mine), plural(len(mine), "node", "nodes"), gpus, e.groupName(g), need, strings.Join(others, ", "))}}
}

// heldOn is the GPUs (in whole-GPU shares) each group holds on nodes:
// by its workers when the run records them, else by component (group 0).
func (e *engine) heldOn(nodes []int32) map[group]float64 {
	held := map[group]float64{}
	for _, at := range nodes {
		ns := e.table[at]
		if e.store == nil {
			for ci := range comp(nComp) {
				for _, x := range ns.usable {
					held[group{ci, 0}] += ns.shareOf(ci)[x]
				}
			}
			continue
		}
		for _, r := range ns.slots() {
			for s := r.first; s < r.first+r.n; s++ {
				w := e.store.at(int(s))
				ci := compOf(w.Component)
				if ci < 0 || ci >= comp(nComp) || w.Index >= e.demands[ci].asked {
					continue
				}
				gi, _ := e.demands[ci].groupAt(w.Index)
				held[group{ci, gi}] += float64(len(w.GPUs)) * w.GPUShare
			}
		}
	}
	return held
}

// groupName names group g as messages do: its component, and for env
// with several groups its position (env[1]).
func (e *engine) groupName(g group) string {
	if len(e.demands[g.c].groups) > 1 {
		return fmt.Sprintf("%s[%d]", g.c.Component(), g.i)
	}
	return string(g.c.Component())
}
