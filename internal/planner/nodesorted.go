package planner

import "strings"

// nodesOrder is what an allocator knows of its nodes' order.
type nodesOrder int8

const (
	orderUnknown nodesOrder = iota
	orderSorted             // sorted by id, some id given twice
	orderStrict             // sorted by id, each id once
	orderUnsorted
)

// nodesSorted reports whether the allocator's nodes are sorted by id,
// checked once: dense asks at every holding, and 20,000 string
// comparisons each time were a sixth of a node leave's replan.
func (a *allocator) nodesSorted() bool {
	if a.sorted == orderUnknown {
		if f := a.sharedFacts(); f != nil && f.sorted != orderUnknown {
			a.sorted = f.sorted
			return a.sorted == orderSorted || a.sorted == orderStrict
		}
		a.sorted = orderStrict
		for i := 1; i < len(a.nodes) && a.sorted != orderUnsorted; i++ {
			switch strings.Compare(a.nodes[i-1].ID, a.nodes[i].ID) {
			case 0:
				a.sorted = orderSorted
			case 1:
				a.sorted = orderUnsorted
			}
		}
		if f := a.sharedFacts(); f != nil {
			f.sorted = a.sorted
		}
	}
	return a.sorted == orderSorted || a.sorted == orderStrict
}

// nodesStrict reports whether the allocator's nodes are sorted by id
// with each id once: where they are, dense(byID) puts every hold at its
// node's one position, as sameDense would check it.
func (a *allocator) nodesStrict() bool {
	return a.nodesSorted() && a.sorted == orderStrict
}

// nodeFacts is what the allocators of one PlanAll (its trials, each an
// allocator of its own, on the same nodes, which none writes during it)
// found of those nodes: their order, and the kept dense holdings found
// to be dense(byID) on them (sameDense), by the holding's byID. A grow
// tries several placements, each of which would check again the
// holding of a plan of 20,000 nodes.
type nodeFacts struct {
	nodes  []Node
	sorted nodesOrder
	dense  map[*holding]idHolds
}

// idHolds names a holding by id by its first element and length: lists
// kept with a plan's state are never written.
type idHolds struct {
	first **idHold
	n     int
}

func idHoldsOf(h []*idHold) idHolds {
	if len(h) == 0 {
		return idHolds{}
	}
	return idHolds{&h[0], len(h)}
}

// sharedFacts is the PlanAll's facts where they are of this allocator's
// very nodes, else nil.
func (a *allocator) sharedFacts() *nodeFacts {
	f := a.facts
	if f == nil || len(f.nodes) != len(a.nodes) || len(a.nodes) == 0 || &f.nodes[0] != &a.nodes[0] {
		return nil
	}
	return f
}
