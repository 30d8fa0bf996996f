package planner

import "slices"

// nodeView is the nodes as one job's runs see them (a remainder): base,
// but for the positions of over, whose nodes are copies of base's with
// other plans' holds written in. A run that starts from a previous
// state reads the nodes once (merge) and copies only those that
// changed, so a remainder that differs from the cluster at a few nodes
// need not copy the other 20,000 for it; every other run is given the
// nodes whole (slice). Written by the one goroutine of its allocator.
type nodeView struct {
	base []Node
	over map[int]*Node // nil: base is the view
}

// slice is the view as nodes of its own, made (once) where it has
// copies over base: what runs that keep their nodes, or write them, are
// given.
func (v *nodeView) slice() []Node {
	if v.over == nil {
		return v.base
	}
	out := slices.Clone(v.base)
	for j, n := range v.over {
		out[j] = *n
	}
	v.base, v.over = out, nil
	return out
}
