package planner

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/poolplanner/poolplanner/plan"
)

// idHold is a hold by node id rather than position: what a plan holds
// does not depend on the inventory it is read against, so it can be kept
// with the plan and read again by the next run however the nodes
// changed.
type idHold struct {
	id   string
	gpus []int // sorted, each once
	resv []int // sorted, each once, none in gpus
	cpus float64
}

// heldCache is a plan's holding by node id (sorted by id), kept in its
// run's state: a plan's placement is not changed once made. Read by the
// loop and by validations alike, hence atomic; two computing it at once
// compute the same.
type heldCache = atomic.Pointer[[]*idHold]

// byID is what p holds, node by node, sorted by id: from p's state when
// computed before; for a plan made from the state of one of the jobs'
// previous plans (an incremental run), that plan's holding with only the
// nodes the run touched read again; else from every worker and pool.
func (a *allocator) byID(p *Plan) []*idHold {
	st := p.state
	if st != nil {
		if h := st.held.Load(); h != nil {
			return *h
		}
	}
	out := a.derived(p)
	if out == nil {
		out = scanHeld(p)
	}
	if st != nil {
		st.held.Store(&out)
	}
	return out
}

// derived is p's holding patched from its run's previous plan's, or nil
// when p's run did not start from a previous plan at hand whose holding
// is known.
func (a *allocator) derived(p *Plan) []*idHold {
	st := p.state
	if st == nil || st.from == nil || st.spec.isManual() || len(p.Unplaced) > 0 {
		// A degraded plan keeps its unplaced workers' GPUs (resv), which
		// the patch below does not read: scan it.
		return nil
	}
	var base []*idHold
	var from *Plan
	for i := range a.jobs {
		q := a.jobs[i].Prev
		if q != nil && q.state != nil && q.state.token == st.from {
			if h := q.state.held.Load(); h != nil {
				base, from = *h, q
			}
			break
		}
	}
	if base == nil {
		return nil
	}
	out := patchHeld(p, base)
	shareDense(p, from, out, base)
	return out
}

// shareDense keeps with p, whose holding by id h is from's (base),
// shared, from's holding by position where it is kept: the same holding
// at the same positions (denseOf checks them against its nodes before
// use), so that a plan re-read on a node only for others' holds there
// does not lay out 20,000 holds again.
func shareDense(p, from *Plan, h, base []*idHold) {
	if p.state == nil || from == nil || from.state == nil || len(h) == 0 || len(h) != len(base) || &h[0] != &base[0] {
		return
	}
	if d := from.state.dense.Load(); d != nil && p.state.dense.Load() == nil {
		p.state.dense.Store(d)
	}
}

// patchHeld is p's holding: base, the holding of the plan p's run
// started from, with the nodes the run touched read again from p.
func patchHeld(p *Plan, base []*idHold) []*idHold {
	st := p.state
	ids := st.changedIDs()
	if len(ids) == 0 {
		// A run that touched no node holds what it started from: a
		// holding is never written, so the two plans share it.
		return base[:len(base):len(base)]
	}
	content := st.nodeContent(p)
	// The nodes read again, each as p holds it (nil: nothing there).
	again := make([]*idHold, len(ids))
	same := true
	for i, id := range ids {
		nc := content(id)
		if len(nc.Workers) > 0 || len(nc.Pools) > 0 {
			h := idHold{id: id}
			for _, w := range nc.Workers {
				h.cpus += w.CPUs
				for _, g := range w.GPUs {
					h.gpus = addGPU(h.gpus, g)
				}
			}
			for _, pn := range nc.Pools {
				h.gpus = allocated(h.gpus, pn)
			}
			again[i] = &h
		}
		k, found := slices.BinarySearchFunc(base, id, func(x *idHold, id string) int { return strings.Compare(x.id, id) })
		switch {
		case found != (again[i] != nil):
			same = false
		case found:
			same = same && sameIDHold(base[k], again[i])
		}
	}
	if same {
		// Every node read again holds in p what it held in base (a run
		// that re-read a node for another plan's holds there, not its
		// own: a shrink's taker placed beside it): p holds base, shared,
		// not copied over 20,000 nodes for it.
		return base[:len(base):len(base)]
	}
	out := make([]*idHold, 0, len(base)+len(ids))
	k := 0
	for i, id := range ids {
		for k < len(base) && base[k].id < id {
			out = append(out, base[k])
			k++
		}
		if k < len(base) && base[k].id == id {
			k++ // read again
		}
		if again[i] != nil {
			out = append(out, again[i])
		}
	}
	return append(out, base[k:]...)
}

// sameIDHold reports whether x and y hold the same on their node.
func sameIDHold(x, y *idHold) bool {
	return x.id == y.id && x.cpus == y.cpus && slices.Equal(x.gpus, y.gpus) && slices.Equal(x.resv, y.resv)
}

// scanHeld is p's holding read from every worker and pool (and, for a
// degraded plan, the GPUs its unplaced workers ran on last).
func scanHeld(p *Plan) []*idHold {
	var out []idHold
	pos := map[string]int{}
	lastID, last := "", -1
	// Workers and allocations come node by node: the last node's place
	// at hand saves most lookups.
	at := func(id string) *idHold {
		if id != lastID || last < 0 {
			i, ok := pos[id]
			if !ok {
				i = len(out)
				pos[id] = i
				out = append(out, idHold{id: id})
			}
			lastID, last = id, i
		}
		return &out[last]
	}
	for _, w := range p.Workers.All() {
		h := at(w.NodeID)
		h.cpus += w.CPUs
		for _, g := range w.GPUs {
			h.gpus = addGPU(h.gpus, g)
		}
	}
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes.All() {
			h := at(n.NodeID)
			h.gpus = allocated(h.gpus, *n)
		}
	}
	for _, u := range p.Unplaced {
		h := at(u.NodeID)
		for _, g := range u.GPUs {
			if _, in := slices.BinarySearch(h.gpus, g); !in {
				h.resv = addGPU(h.resv, g)
			}
		}
	}
	slices.SortFunc(out, func(x, y idHold) int { return strings.Compare(x.id, y.id) })
	// By pointer, into one slab: a plan patched from this one shares
	// the entries of the nodes it did not change, and copies only the
	// list (8 bytes a node, not 72).
	ptrs := make([]*idHold, len(out))
	for i := range out {
		ptrs[i] = &out[i]
	}
	return ptrs
}

// allocated is gpus with every GPU of a pool node's allocations.
func allocated(gpus []int, n plan.PoolNode) []int {
	for _, c := range plan.GPUComponents {
		for _, r := range n.Allocations[c] {
			for g := r.First; g <= r.Last; g++ {
				gpus = addGPU(gpus, g)
			}
		}
	}
	return gpus
}

// addGPU is the sorted list with g, once.
func addGPU(list []int, g int) []int {
	if n := len(list); n == 0 || list[n-1] < g {
		return append(list, g) // GPUs mostly come in order
	}
	if i, found := slices.BinarySearch(list, g); !found {
		return slices.Insert(list, i, g)
	}
	return list
}

// heldCount is the GPUs a holding by id uses (not those it keeps).
func heldCount(h []*idHold) int {
	n := 0
	for _, x := range h {
		n += len(x.gpus)
	}
	return n
}

// dense is a holding by id as positions in the allocator's nodes (sorted
// by position), the nodes not there left out. Nodes sorted by id (the
// service's are) are matched by a merge, not looked up one by one.
func (a *allocator) dense(byID []*idHold) holding {
	out := make(holding, 0, len(byID))
	if a.index == nil && a.nodesSorted() {
		i := 0
		for _, x := range byID {
			for i < len(a.nodes) && a.nodes[i].ID < x.id {
				i++
			}
			if i < len(a.nodes) && a.nodes[i].ID == x.id {
				out = append(out, hold{at: int32(i), idHold: x})
			}
		}
		return out
	}
	for _, x := range byID {
		if i, ok := a.pos(x.id); ok {
			out = append(out, hold{at: i, idHold: x})
		}
	}
	slices.SortFunc(out, func(x, y hold) int { return cmp.Compare(x.at, y.at) })
	return out
}

// denseOf is dense(byID(p)), kept with p's state for the next
// allocator: every trial of PlanAllWith's search, and its growth, makes
// an allocator of its own, and each placed p that holds a whole cluster
// (20,000 holds) once more. What is kept is used only where it still
// names the nodes at their positions (sameDense); it is kept only where
// every node held is among the nodes, so that nothing left out then can
// be missed now.
func (a *allocator) denseOf(p *Plan) holding {
	byID := a.byID(p)
	st := p.state
	f := a.sharedFacts()
	if st != nil {
		if h := st.dense.Load(); h != nil {
			if f != nil && len(byID) > 0 && f.dense[h] == idHoldsOf(byID) {
				return *h // checked on these nodes by another of the PlanAll's allocators
			}
			if a.sameDense(*h, byID) {
				f.checked(h, byID)
				return *h
			}
		}
	}
	out := a.dense(byID)
	// Made on nodes sorted with each id once, out is dense(byID) on them
	// wherever it holds every node byID does: the walk of sameDense over
	// 20,000 holds would find nothing.
	if st != nil && len(out) == len(byID) && (a.nodesStrict() || a.sameDense(out, byID)) {
		h := &out
		st.dense.Store(h)
		f.checked(h, byID)
	}
	return out
}

// checked records that h is dense(byID) on f's nodes (f nil: nowhere).
func (f *nodeFacts) checked(h *holding, byID []*idHold) {
	if f == nil || len(byID) == 0 {
		return
	}
	if f.dense == nil {
		f.dense = map[*holding]idHolds{}
	}
	f.dense[h] = idHoldsOf(byID)
}

// sameDense reports whether h is dense(byID) on the allocator's nodes:
// they are sorted by id and every hold's position holds its node, and no
// neighbour shares its id (with an id given twice, dense's merge and its
// index would each pick one of them).
func (a *allocator) sameDense(h holding, byID []*idHold) bool {
	if len(h) != len(byID) || !a.nodesSorted() {
		return false
	}
	n := int32(len(a.nodes))
	for k, x := range h {
		id := byID[k].id
		if x.at < 0 || x.at >= n || a.nodes[x.at].ID != id ||
			x.at > 0 && a.nodes[x.at-1].ID == id || x.at+1 < n && a.nodes[x.at+1].ID == id {
			return false
		}
	}
	return true
}

// find is pos for a few lookups: by binary search where the nodes are
// sorted and no index was built, so that a shrink of 8 workers does not
// index 20,000 nodes to find theirs. Of nodes sharing an id it finds the
// last, as the index does.
func (a *allocator) find(id string) (int32, bool) {
	if a.index != nil || !a.nodesSorted() {
		return a.pos(id)
	}
	i, ok := slices.BinarySearchFunc(a.nodes, id, func(n Node, id string) int { return strings.Compare(n.ID, id) })
	if !ok {
		return 0, false
	}
	for i+1 < len(a.nodes) && a.nodes[i+1].ID == id {
		i++
	}
	return int32(i), true
}

// searchedMax is how many positions pos finds by search in sorted nodes
// before it builds the index: past a few hundred, the index is cheaper.
const searchedMax = 256

// pos is node id's position in the allocator's nodes, by the index
// (built on first use: dense builds none where the nodes are sorted).
func (a *allocator) pos(id string) (int32, bool) {
	if a.index == nil && a.searched < searchedMax && a.nodesSorted() {
		// Sorted nodes are searched for the first few asked (a shrink's
		// takers ask a handful): the index of 20,000 costs 0.8 MB. The
		// last node of the id, as the index keeps.
		a.searched++
		i := sort.Search(len(a.nodes), func(i int) bool { return a.nodes[i].ID > id }) - 1
		if i >= 0 && a.nodes[i].ID == id {
			return int32(i), true
		}
		return 0, false
	}
	if a.index == nil {
		a.index = make(map[string]int32, len(a.nodes))
		for i := range a.nodes {
			a.index[a.nodes[i].ID] = int32(i)
		}
	}
	i, ok := a.index[id]
	return i, ok
}
