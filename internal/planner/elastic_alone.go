package planner

import (
	"fmt"
	"strings"
)

// IsElastic reports whether spec has an elastic group (worker_num
// {min, max}).
func IsElastic(spec *Spec) bool { return len(elasticRefs(spec)) > 0 }

// PlanAlone plans one spec alone on nodes, as the offline planner does:
// from prev as Replan does (nil: afresh), every elastic group grown up
// to its max within nodes (PlanAllWith with no other plan).
func PlanAlone(prev *Plan, spec *Spec, nodes []Node) Outcome {
	o := PlanAll([]Job{{Name: "(offline)", Spec: spec, Prev: prev}}, nodes)[0]
	if prev != nil || o.Err != nil {
		return o
	}
	// A first plan: made afresh at the sizes growth reached, it reads as
	// one placement, not as a minimum and its growth.
	if doc, err := Compute(sized(spec, heldCounts(o.Plan, elasticRefs(spec))), nodes); err == nil {
		doc.Priority, doc.GPUsHeld = o.Plan.Priority, HeldGPUs(doc)
		return Outcome{Plan: doc, Change: o.Change}
	}
	return o
}

// growBeside grows doc, spec's plan at its minimums on nodes (what other
// plans leave), as far as nodes allow, and says in its warnings what
// the minimum needs and what the cluster would give now.
func growBeside(doc *Plan, spec *Spec, nodes []Node) *Plan {
	refs := elasticRefs(spec)
	if len(refs) == 0 || !doc.Valid() {
		return doc
	}
	minGPUs := HeldGPUs(doc)
	el := &elastic{jobs: []Job{{Name: "(new plan)", Spec: spec}}, nodes: nodes, refs: [][]elasticRef{refs}}
	sizes := make([]int, len(refs))
	for k, r := range refs {
		sizes[k] = r.min
	}
	prio := doc.Priority
	got, out := el.grow([][]int{sizes}, []Outcome{{Plan: doc, Change: &Change{}}}, ElasticOptions{})
	grown := out[0].Plan
	grown.Priority = prio
	grown.Warnings = append(grown.Warnings, elasticWarning(refs, got[0], minGPUs, HeldGPUs(grown)))
	return grown
}

// ElasticWarning is growBeside's warning for doc, spec's plan as a
// replan made it on nodes: what spec's minimum needs (planned alone on
// nodes) and what doc gives. Empty when spec is not elastic.
func ElasticWarning(spec *Spec, doc *Plan, nodes []Node) string {
	refs := elasticRefs(spec)
	if len(refs) == 0 {
		return ""
	}
	floor := make([]int, len(refs))
	for k, r := range refs {
		floor[k] = r.min
	}
	minGPUs := 0
	if least, err := Compute(sized(spec, floor), nodes); err == nil {
		minGPUs = HeldGPUs(least)
	}
	return elasticWarning(refs, heldCounts(doc, refs), minGPUs, HeldGPUs(doc))
}

func elasticWarning(refs []elasticRef, got []int, minGPUs, held int) string {
	var parts []string
	for k, r := range refs {
		parts = append(parts, fmt.Sprintf("%s %d of %d..%d", r, got[k], r.min, r.max))
	}
	return fmt.Sprintf("elastic: the minimum needs %d GPUs in all; the cluster would give %s now (%d GPUs)", minGPUs, strings.Join(parts, ", "), held)
}
