package planner

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Reasons a node was excluded for a component, or took it only in part.
// Tests assert on these; explanations, the text output and error messages
// print them.
const (
	ReasonNoFreeGPUs    = "no free GPUs"
	ReasonCPUsExhausted = "CPUs exhausted"
	ReasonUnhealthyGPU  = "unhealthy GPU excluded"
	// ReasonDrained: GPUs of the node are drained (planner drain, or held
	// out by the planner) and get no work.
	ReasonDrained       = "drained GPU excluded"
	ReasonNoGPUs        = "no GPUs"
	ReasonNoHealthyGPUs = "no healthy GPUs"
	// ReasonPoolShared is a compromise, not an exclusion: the component was
	// placed on a node of another pool because the nodes that keep pools
	// pure had no room.
	ReasonPoolShared = "node shared with another pool"
	// ReasonNoPoolGPUs concerns no node: the manual pools give the
	// component no GPUs.
	ReasonNoPoolGPUs = "no resource pool gives it GPUs"
	reasonTooFew     = "fewer than %d healthy GPUs"
)

// TooFewGPUs is the reason a node is excluded for a worker needing k GPUs
// of one node.
func TooFewGPUs(k int) string { return fmt.Sprintf(reasonTooFew, k) }

// ReasonHeldBy, followed by plan names ("held by plan a, plan b"), is
// the reason a node is excluded when other plans sharing the cluster
// hold the healthy GPUs it lacks (PlanAll): never "no healthy GPUs" or
// "fewer than k healthy GPUs" for GPUs that are healthy.
const ReasonHeldBy = "held by plan "

// heldReason says which other plans hold ns's healthy GPUs ("held by
// plan a, plan b"); "" when none does.
func heldReason(ns *nodeState) string {
	n := ns.node
	var names []string
	for g, name := range ns.mark().heldBy {
		if name != "" && g < n.GPUs && n.Healthy(g) && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return ReasonHeldBy + strings.Join(names, ", plan ")
}

// tooFew is why node ns has too few GPUs group g may use for a worker of
// count: too few healthy ones (TooFewGPUs), or, where enough are healthy
// but other plans hold some, which plans hold them.
func (e *engine) tooFew(ns *nodeState, g group, count int) string {
	n := ns.node
	if len(ns.mark().heldBy) > 0 {
		healthy, c := 0, e.con(g)
		for x := 0; x < n.GPUs; x++ {
			if n.Healthy(x) && (!c.any() || e.gpuAllowed(g, n, x)) {
				healthy++
			}
		}
		if why := heldReason(ns); healthy >= count && why != "" {
			return why
		}
	}
	return TooFewGPUs(count)
}

// maxExamples bounds the node ids an explanation names per reason.
const maxExamples = 8

// tally counts nodes for one reason, keeping a few ids.
type tally struct {
	nodes int
	ids   []string
	last  string
}

func (t *tally) add(id string) {
	if id == "" || id == t.last && t.nodes > 0 {
		return
	}
	t.last = id
	t.nodes++
	if len(t.ids) < maxExamples {
		t.ids = append(t.ids, id)
	}
}

// tallies is reasons by component (rank; nComp for node-wide notes).
type tallies [nComp + 1]map[string]*tally

func (ts *tallies) add(ci int, reason, id string) {
	if ts[ci] == nil {
		ts[ci] = map[string]*tally{}
	}
	t := ts[ci][reason]
	if t == nil {
		t = &tally{}
		ts[ci][reason] = t
	}
	t.add(id)
}

// noteTallies counts the notes of every node, those this run made and
// those it kept with the nodes it did not touch.
func (e *engine) noteTallies() *tallies {
	var ts tallies
	for _, ns := range e.table {
		for _, n := range ns.notes() {
			k := nComp
			if n.comp != "" {
				k = n.comp.Rank()
			}
			ts.add(k, n.reason, ns.node.ID)
		}
	}
	return &ts
}

// notesDoc lists every node's notes, in node order.
func (e *engine) notesDoc() []plan.Note {
	var out []plan.Note
	for _, ns := range e.table {
		for _, n := range ns.notes() {
			out = append(out, plan.Note{NodeID: ns.node.ID, Component: n.comp, Reason: n.reason})
		}
	}
	return out
}

// explainComp is component ci's explanation: its notes, the nodes passed
// by, the node-wide notes if it needs GPUs, and its displaced workers.
func (e *engine) explainComp(ci comp, ts *tallies) plan.Explanation {
	d := e.demands[ci]
	x := plan.Explanation{Component: d.comp, Asked: d.asked, Placed: d.asked - d.left()}
	needsGPUs := gpusNeeded(d.groups) > 0
	for reason, t := range ts[ci] {
		rc := plan.ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids}
		if reason == ReasonPoolShared || reason == ReasonPreferNVLink {
			x.Compromises = append(x.Compromises, rc)
		} else {
			x.Excluded = append(x.Excluded, rc)
		}
	}
	// A node without a GPU (a control-plane VM beside the GPU nodes)
	// cannot take a GPU worker: worth saying when the component fell
	// short, noise in the why of every component placed in full. (The
	// notes keep it.)
	full := x.Placed == x.Asked
	if full {
		x.Excluded = slices.DeleteFunc(x.Excluded, func(rc plan.ReasonCount) bool { return rc.Reason == ReasonNoGPUs })
	}
	if needsGPUs {
		for reason, t := range ts[nComp] {
			if full && reason == ReasonNoGPUs {
				continue
			}
			x.Excluded = append(x.Excluded, plan.ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids})
		}
	}
	for reason, t := range e.why.exhausted[ci] {
		x.Excluded = append(x.Excluded, plan.ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids})
	}
	if !e.invalid {
		x.Displaced = e.displacedCounts(d.comp)
	}
	sortCounts(x.Excluded)
	sortCounts(x.Compromises)
	if b := e.why.bound; b != nil && b.g.c == ci {
		x.Excluded = append([]plan.ReasonCount{b.rc}, x.Excluded...)
	}
	return x
}

// displacedCounts groups the component's displaced workers by why, with
// the nodes they were on.
func (e *engine) displacedCounts(c plan.Component) []plan.ReasonCount {
	byWhy := map[string]*plan.ReasonCount{}
	nodes := map[string]map[string]bool{}
	var out []*plan.ReasonCount
	for _, d := range e.displaced {
		if d.Component != c || e.isUnseated(d) {
			continue
		}
		rc := byWhy[d.Why]
		if rc == nil {
			rc = &plan.ReasonCount{Reason: d.Why}
			byWhy[d.Why], nodes[d.Why] = rc, map[string]bool{}
			out = append(out, rc)
		}
		rc.Workers++
		if d.NodeID != "" && !nodes[d.Why][d.NodeID] {
			nodes[d.Why][d.NodeID] = true
			rc.Nodes++
			if len(rc.NodeIDs) < maxExamples {
				rc.NodeIDs = append(rc.NodeIDs, d.NodeID)
			}
		}
	}
	list := make([]plan.ReasonCount, len(out))
	for i, rc := range out {
		list[i] = *rc
	}
	slices.SortFunc(list, func(a, b plan.ReasonCount) int {
		return cmp.Or(cmp.Compare(b.Workers, a.Workers), strings.Compare(a.Reason, b.Reason))
	})
	return list
}

func sortCounts(rs []plan.ReasonCount) {
	slices.SortFunc(rs, func(a, b plan.ReasonCount) int {
		return cmp.Or(cmp.Compare(b.Nodes, a.Nodes), strings.Compare(a.Reason, b.Reason))
	})
}

// explain is every component's explanation that says something: it was
// not placed in full (when placing was tried: a plan refused by the
// arithmetic says so in its capacity), something excluded nodes for it,
// it was placed against a preference, or workers of it moved.
func (e *engine) explain() []plan.Explanation {
	ts := e.noteTallies()
	var out []plan.Explanation
	for _, d := range e.demands {
		ci := d.ci
		if d.asked == 0 {
			continue
		}
		x := e.explainComp(ci, ts)
		short := e.attempted && x.Placed < x.Asked
		if short || len(x.Excluded) > 0 || len(x.Compromises) > 0 || len(x.Displaced) > 0 {
			out = append(out, x)
		}
	}
	if moved := e.displacedCounts(plan.Buffer); len(moved) > 0 && !e.invalid {
		out = append(out, plan.Explanation{Component: plan.Buffer, Asked: len(e.buffers), Placed: len(e.buffers), Displaced: moved})
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
