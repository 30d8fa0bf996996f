package planner

import "slices"

// nodeView is the nodes as one job's runs see them (a remainder): base,
// with other plans' holds written over it, in one of two ways. over: at
// its positions, copies of base's nodes with the holds written in; a
// run that starts from a previous state reads the nodes once (merge) and
// copies only those that changed, so a remainder that differs from the
// cluster at a few nodes need not copy the other 20,000 for it. marks:
// every node's mark, by position, which the run's states keep beside
// the node (nodeState.held): a remainder that differs everywhere (a
// shrink's taker beside a plan of the whole cluster) costs a mark of 32
// bytes a node, not a copy of 270. Runs that keep their nodes as a
// slice, or write them, are given the nodes whole (slice). Written by
// the one goroutine of its allocator.
type nodeView struct {
	base  []Node
	over  map[int]*Node // nil: none
	marks []mark        // nil: base's own; never set with over
}

// slice is the view as nodes of their own, made (once) where it has
// copies or marks over base: what runs that keep their nodes, or write
// them, are given.
func (v *nodeView) slice() []Node {
	switch {
	case v.over != nil:
		out := slices.Clone(v.base)
		for j, n := range v.over {
			out[j] = *n
		}
		v.base, v.over = out, nil
	case v.marks != nil:
		out := slices.Clone(v.base)
		for j, m := range v.marks {
			out[j].HeldBy, out[j].CPUsHeld = m.heldBy, m.cpus
		}
		v.base, v.marks = out, nil
	}
	return v.base
}

// mark is node j's mark as the view has it.
func (v *nodeView) mark(j int) mark {
	switch {
	case v.marks != nil:
		return v.marks[j]
	case v.over != nil:
		if n := v.over[j]; n != nil {
			return markOf(n)
		}
	}
	return markOf(&v.base[j])
}
