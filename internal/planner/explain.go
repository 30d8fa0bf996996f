package planner

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Reasons a node was excluded for a component, or took it only in part.
// Tests assert on these; explanations, the text output and error messages
// print them.
const (
	ReasonNoFreeGPUs    = "no free GPUs"
	ReasonCPUsExhausted = "CPUs exhausted"
	ReasonUnhealthyGPU  = "unhealthy GPU excluded"
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

// maxExamples bounds the node ids an explanation names per reason.
const maxExamples = 8

// Note records a reason against one node: a component it was excluded
// for or took only in part, or (no component) the node as a whole.
type Note struct {
	NodeID    string    `json:"node_id"`
	Component Component `json:"component,omitempty"`
	Reason    string    `json:"reason"`
}

// Explanation says why one component was not placed in full, or not
// where it would go first, grouped as Nomad's AllocMetric groups it:
// which reason excluded how many nodes, which compromises were made, and
// (incremental plans) which workers of the previous plan had to move.
type Explanation struct {
	Component Component `json:"component"`
	Asked     int       `json:"asked"`
	Placed    int       `json:"placed"`
	// Excluded counts the nodes each reason excluded.
	Excluded []ReasonCount `json:"excluded,omitempty"`
	// Compromises counts the nodes the component took against its first
	// preference (ReasonPoolShared).
	Compromises []ReasonCount `json:"compromises,omitempty"`
	// Displaced counts the workers of the previous plan that could not
	// stay, by why (the Why constants) and the nodes they were on.
	Displaced []ReasonCount `json:"displaced,omitempty"`
}

// ReasonCount is one reason and how many nodes (and, for displaced
// workers, workers) it concerns, with up to maxExamples node ids.
type ReasonCount struct {
	Reason  string   `json:"reason"`
	Nodes   int      `json:"nodes"`
	Workers int      `json:"workers,omitempty"`
	NodeIDs []string `json:"node_ids,omitempty"`
}

// String reads as a person would say it: "CPUs exhausted on 12 nodes
// (n1, n2, ...)", "unhealthy GPU excluded on node-07".
func (r ReasonCount) String() string {
	s := r.Reason
	if r.Workers > 0 {
		s = fmt.Sprintf("%d %s: %s", r.Workers, plural(r.Workers, "worker", "workers"), s)
	}
	if r.Nodes == 0 {
		return s
	}
	if r.Nodes == 1 && len(r.NodeIDs) == 1 {
		return s + " on " + r.NodeIDs[0]
	}
	s += fmt.Sprintf(" on %d %s", r.Nodes, plural(r.Nodes, "node", "nodes"))
	if len(r.NodeIDs) > 0 {
		s += " (" + strings.Join(r.NodeIDs, ", ")
		if r.Nodes > len(r.NodeIDs) {
			s += fmt.Sprintf(" and %d more", r.Nodes-len(r.NodeIDs))
		}
		s += ")"
	}
	return s
}

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
		for _, n := range ns.notes {
			ci := nComp
			if n.comp != "" {
				ci = n.comp.Rank()
			}
			ts.add(ci, n.reason, ns.node.ID)
		}
	}
	return &ts
}

// notesDoc lists every node's notes, in node order.
func (e *engine) notesDoc() []Note {
	var out []Note
	for _, ns := range e.table {
		for _, n := range ns.notes {
			out = append(out, Note{NodeID: ns.node.ID, Component: n.comp, Reason: n.reason})
		}
	}
	return out
}

// explainComp is component ci's explanation: its notes, the nodes passed
// by, the node-wide notes if it needs GPUs, and its displaced workers.
func (e *engine) explainComp(ci int, ts *tallies) Explanation {
	d := e.demands[ci]
	x := Explanation{Component: d.comp, Asked: d.asked, Placed: d.asked - d.left()}
	needsGPUs := gpusNeeded(d.groups) > 0
	for reason, t := range ts[ci] {
		rc := ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids}
		if reason == ReasonPoolShared {
			x.Compromises = append(x.Compromises, rc)
		} else {
			x.Excluded = append(x.Excluded, rc)
		}
	}
	if needsGPUs {
		for reason, t := range ts[nComp] {
			x.Excluded = append(x.Excluded, ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids})
		}
	}
	for reason, t := range e.passed[ci] {
		x.Excluded = append(x.Excluded, ReasonCount{Reason: reason, Nodes: t.nodes, NodeIDs: t.ids})
	}
	x.Displaced = e.displacedCounts(d.comp)
	sortCounts(x.Excluded)
	sortCounts(x.Compromises)
	return x
}

// displacedCounts groups the component's displaced workers by why, with
// the nodes they were on.
func (e *engine) displacedCounts(c Component) []ReasonCount {
	byWhy := map[string]*ReasonCount{}
	nodes := map[string]map[string]bool{}
	var out []*ReasonCount
	for _, d := range e.displaced {
		if d.Component != c {
			continue
		}
		rc := byWhy[d.Why]
		if rc == nil {
			rc = &ReasonCount{Reason: d.Why}
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
	list := make([]ReasonCount, len(out))
	for i, rc := range out {
		list[i] = *rc
	}
	slices.SortFunc(list, func(a, b ReasonCount) int {
		return cmp.Or(cmp.Compare(b.Workers, a.Workers), strings.Compare(a.Reason, b.Reason))
	})
	return list
}

func sortCounts(rs []ReasonCount) {
	slices.SortFunc(rs, func(a, b ReasonCount) int {
		return cmp.Or(cmp.Compare(b.Nodes, a.Nodes), strings.Compare(a.Reason, b.Reason))
	})
}

// explain is every component's explanation that says something: it was
// not placed in full (when placing was tried: a plan refused by the
// arithmetic says so in its capacity), something excluded nodes for it,
// it was placed against a preference, or workers of it moved.
func (e *engine) explain() []Explanation {
	ts := e.noteTallies()
	var out []Explanation
	for ci, d := range e.demands {
		if d.asked == 0 {
			continue
		}
		x := e.explainComp(ci, ts)
		short := e.attempted && x.Placed < x.Asked
		if short || len(x.Excluded) > 0 || len(x.Compromises) > 0 || len(x.Displaced) > 0 {
			out = append(out, x)
		}
	}
	return out
}

// excludedText is the exclusions in one line: "fewer than 4 healthy GPUs
// on 30 nodes (...), CPUs exhausted on 12 nodes (...)".
func (x Explanation) excludedText() string {
	parts := make([]string, len(x.Excluded))
	for i, r := range x.Excluded {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// Text is the explanation as a person reads it, one line per reason.
func (x Explanation) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d placed\n", x.Component, x.Placed, x.Asked)
	for _, r := range x.Excluded {
		fmt.Fprintf(&b, "  excluded: %s\n", r)
	}
	for _, r := range x.Compromises {
		fmt.Fprintf(&b, "  compromise: %s\n", r)
	}
	for _, r := range x.Displaced {
		fmt.Fprintf(&b, "  moved: %s\n", r)
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
