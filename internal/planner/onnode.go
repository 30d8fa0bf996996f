package planner

import (
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// EachOnNode calls f with each worker p places on node id, in OnNode's
// order (by slot, buffer last), without copying them, and reports
// whether it could: only a plan with its run's state knows its workers
// by node. A first revision's 20,000 assignments read this way copy no
// worker into a list first.
func (p *Plan) EachOnNode(id string, f func(*plan.Worker)) bool {
	st := p.state
	if st == nil {
		return false
	}
	i, ok := slices.BinarySearchFunc(st.table, id, func(ns *nodeState, id string) int {
		return strings.Compare(ns.node.ID, id)
	})
	if !ok {
		return true
	}
	for _, r := range sortedSlots(st.table[i].slots()) {
		for s := r.first; s < r.first+r.n; s++ {
			f(p.Workers.At(int(s)))
		}
	}
	if k, ok := st.bufferIndex()[int32(i)]; ok {
		f(p.Workers.At(p.Workers.Len() - len(st.buffers) + k))
	}
	return true
}
