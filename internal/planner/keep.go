package planner

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/poolplanner/poolplanner/plan"
)

// Why a worker of the previous plan cannot keep its place. Tests assert on
// these; Change.Summary and the plan's explanations print them.
const (
	WhyNew         = "new worker"
	WhyNodeLeft    = "node left"
	WhyGPUGone     = "GPU gone"
	WhyGPUReplaced = "GPU replaced"
	WhyUnhealthy   = "GPU unhealthy"
	// WhyDrained: the worker's node or GPU is drained (planner drain, or
	// held out by the planner: on probation, or flapping).
	WhyDrained  = "drained"
	WhyCPUs     = "CPUs exhausted"
	WhyNeeds    = "needs changed"
	WhyConflict = "GPU taken"
	WhyPool     = "pool changed"
	// WhyConstraint: the group's node_selector, gpu_model,
	// min_gpu_memory_gb or gpu_link no longer allows its place (the spec
	// or the node changed).
	WhyConstraint = "constraints not met"
	// WhyBuffer: a buffer worker goes where its node's train workers are.
	WhyBuffer = "follows its train workers"
	// WhyPreempted, followed by the plan's name: a plan placed before
	// this one (of higher priority, or older of the same) holds the GPU.
	WhyPreempted = "preempted by plan "
)

// Displaced is a worker of the previous plan that had to be placed again,
// or a worker new to the spec.
type Displaced struct {
	Component plan.Component
	Index     int
	// NodeID is where it was; empty for a new worker.
	NodeID string
	// Why is one of the Why constants; Where the node or node:GPU it
	// concerns; By, for WhyPreempted, the plan that holds the GPU.
	Why   string
	Where string
	By    string
}

// runState is what a plan keeps of the run that made it, so that the
// next run can start from it and touch only what changed: the node states
// by id, the nodes with room, the auto pools' node order and the buffers.
// It is read-only; runs copy the states they change.
type runState struct {
	spec  *Spec
	table []*nodeState
	// nodes is the engine's (nil: none such): the nodes of table, in its
	// order, unwritten, which a run of the same nodes may be given as
	// they are (cutFast).
	nodes []Node
	room  []int32
	order [2][]int32
	// rendered are the auto pools' entries in the plan's document, in
	// order's order: a run whose pool lists the same untouched states in
	// the same order shares them rather than writing 20,000 entries again.
	rendered [2]plan.PoolNodes
	// exported are the pools' entries in the plan's export.
	exported    []exportedPool
	buffers     []int32 // buffer index -> node position
	reserveLeft int
	// names are the auto pools' names, by index.
	names []string
	// token names the run that made the plan; from, the run its previous
	// plan's state came from (nil: it did not start from one). Tokens, not
	// states: a plan must not keep its predecessors alive.
	token, from *runToken
	// changed are the nodes (positions) whose placement the run may have
	// changed: the states it made or copied, and the nodes whose buffer it
	// rewrote; gone, the nodes of the previous plan that left.
	changed []int32
	gone    []string
	// ordered says whether the plan's workers are in strictly increasing
	// order of component and index (workersInOrder), once known: at
	// finish, from the previous plan's where that was known (reading only
	// the chunks not shared with it), else when CountMoved first asks.
	// CountMoved passes over the chunks two such lists share.
	ordered atomic.Pointer[orderProof]
	// bufferOf maps a node's position to its buffer index, once asked.
	bufferOnce sync.Once
	bufferOf   map[int32]int
	// held is the plan's holding by node id, once asked (allocator.byID);
	// dense, that holding by position in the nodes last asked with
	// (allocator.denseOf), checked against the nodes at every use.
	held  heldCache
	dense atomic.Pointer[holding]
}

// reusable reports whether a run of spec can start from st without
// checking every worker again: same spec, auto placement (manual pools
// pick nodes by id, so a node joining can change them).
func (st *runState) reusable(spec *Spec) bool {
	return st != nil && !st.rulesManual() && specEqual(st.spec, spec)
}

func (st *runState) rulesManual() bool { return st.spec.Placement.Mode == ModeManual }

// adoptFast and adoptSlow are one rule at two costs (TestAdoptPathsAgree
// holds them to the same placements): a planner that restarted reads its
// plan back and takes the slow path, and must move no worker that one
// still running would keep.
//
// adoptFast starts from prev's run: nodes whose facts did not change keep
// their state untouched; the workers of changed nodes are checked again,
// those of departed nodes displaced. It costs a walk over the node ids and
// work in proportion to what changed.
func (e *engine) adoptFast(nodes []Node, order []int) {
	ps := e.prevState
	m := e.merge(ps.table, nodes, order, e.dropNodes())
	e.store = storeFrom(e.prev.Workers)
	e.moveBuffers()
	e.reserve = ps.reserveLeft
	for p := range e.pools {
		e.pools[p].order = remapAll(ps.order[p], m.remap)
	}
	e.prevBuffers = remapAll(ps.buffers, m.remap)
	for _, c := range m.changed {
		e.keepNode(c.at, c.old)
	}
	for _, ns := range m.left {
		e.gone = append(e.gone, ns.node.ID)
		e.displaceAll(ns, WhyNodeLeft)
		e.reserve += len(ns.reserved())
	}
	e.room = e.roomAfterAdopt(ps.room, m.remap)
	e.newWorkers()
	for _, d := range e.demands {
		ci := d.ci
		d.only(e.displacedOf(ci))
	}
}

// merged is the previous table walked against the new inventory.
type merged struct {
	// remap maps a previous position to this run's, -1 for a node that
	// left.
	remap   []int32
	changed []changedNode
	left    []*nodeState
}

// changedNode is a node whose facts changed, and its previous state.
type changedNode struct {
	at  int32
	old *nodeState
}

// merge builds the run's table from the previous one and the inventory
// (both in id order): a node whose facts are unchanged keeps its state,
// a changed or new node gets a new one, as does a node of force (by
// previous position; nil: none), which hosts a worker a resized run
// drops.
func (e *engine) merge(prev []*nodeState, nodes []Node, order []int, force []bool) merged {
	m := merged{remap: make([]int32, len(prev))}
	e.table = make([]*nodeState, 0, len(order))
	var own []Node
	var ownMarks []mark
	var ownAt []int32
	i := 0
	for _, j := range order {
		n, mk := e.nodeAt(nodes, j), e.markAt(nodes, j)
		for ; i < len(prev) && prev[i].node.ID < n.ID; i++ {
			m.remap[i] = -1
			m.left = append(m.left, prev[i])
		}
		at := int32(len(e.table))
		if i < len(prev) && prev[i].node.ID == n.ID {
			old := prev[i]
			m.remap[i] = at
			i++
			if sameMachine(old.node, n) && old.mark().equal(mk) && (force == nil || !force[i-1]) {
				e.table = append(e.table, old)
				continue
			}
			m.changed = append(m.changed, changedNode{at, old})
		}
		own = append(own, *n)
		ownMarks = append(ownMarks, mk)
		ownAt = append(ownAt, at)
		e.table = append(e.table, nil)
	}
	for ; i < len(prev); i++ {
		m.remap[i] = -1
		m.left = append(m.left, prev[i])
	}
	for k, ns := range newStates(own, ownMarks, e.token, e.groups(), &e.extras) {
		e.table[ownAt[k]] = ns
		e.touched = append(e.touched, ownAt[k])
	}
	return m
}

// remapAll maps positions of the previous table to this one, -1 for
// nodes that left; the order is kept.
func remapAll(pos []int32, remap []int32) []int32 {
	out := make([]int32, 0, len(pos))
	for _, at := range pos {
		if at >= 0 && int(at) < len(remap) && remap[at] >= 0 {
			out = append(out, remap[at])
		} else {
			out = append(out, -1)
		}
	}
	return out
}

// keepNode checks again the workers the previous plan put on a node whose
// facts changed, keeping each that still fits and displacing the rest,
// and keeps its buffer reserve where it still can.
func (e *engine) keepNode(at int32, old *nodeState) {
	// In slot order, as a plan read back from JSON is kept: which workers
	// stay on a node that shrank must not depend on how the plan was made.
	slots := slices.SortedFunc(slices.Values(old.slots()), func(a, b slotRange) int { return int(a.first - b.first) })
	for _, r := range slots {
		for s := r.first; s < r.first+r.n; s++ {
			if e.dropped(int(s)) {
				continue
			}
			w := e.prev.Workers.At(int(s))
			if why, where, by := e.keepOne(at, w); why != "" {
				e.displace(w, why, where, by)
			}
		}
	}
	for _, g := range old.reserved() {
		if !e.keepReserve(at, g) {
			e.reserve++
		}
	}
}

// displaceAll displaces every worker of a node that left.
func (e *engine) displaceAll(ns *nodeState, why string) {
	for _, r := range ns.slots() {
		for s := r.first; s < r.first+r.n; s++ {
			if e.dropped(int(s)) {
				continue
			}
			e.displace(e.prev.Workers.At(int(s)), why, ns.node.ID, "")
		}
	}
}

// displace notes that w of the previous plan must be placed again; by,
// when not empty, is the plan that took its GPU.
func (e *engine) displace(w *plan.Worker, why, where, by string) {
	if by != "" && !slices.Contains(e.takenBy, by) {
		e.takenBy = append(e.takenBy, by)
	}
	e.displaced = append(e.displaced, Displaced{Component: w.Component, Index: w.Index, NodeID: w.NodeID, Why: why, Where: where, By: by})
}

// displacedOf lists the indices of component ci to place again, ascending.
func (e *engine) displacedOf(ci comp) []int {
	var out []int
	for _, d := range e.displaced {
		if compOf(d.Component) == ci {
			out = append(out, d.Index)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// keepOne gives worker w of the previous plan its place on node at if
// every check a new placement meets still holds there; else it says why
// not, and where (and by, the plan that holds its GPU, when that is why).
func (e *engine) keepOne(at int32, w *plan.Worker) (why, where, by string) {
	ci := compOf(w.Component)
	gi, g := e.demands[ci].groupAt(w.Index)
	ns := e.table[at]
	n := ns.node
	if n.Out {
		return WhyDrained, n.ID, ""
	}
	count, frac := gpuCount(g)
	if len(w.GPUs) != count || math.Abs(w.CPUs-g.NumCPUs) > eps || count > 0 && math.Abs(w.GPUShare-frac) > eps {
		return WhyNeeds, n.ID, ""
	}
	tg, ok := e.targetOf(w, ci, at)
	if !ok {
		return WhyPool, n.ID, ""
	}
	for i, x := range w.GPUs {
		if why := e.keepGPU(ns, tg, ci, w, i); why != "" {
			if why == WhyPreempted {
				by = ns.holder(x)
				why += by
			}
			return why, fmt.Sprintf("%s:%d", n.ID, x), by
		}
	}
	p := probe{ns: ns, g: group{ci, gi}, offer: w.GPUs, kept: true}
	_, cpus, r := e.feasible(&p)
	switch r.link {
	case chainOK:
	case chainShare:
		return WhyConflict, fmt.Sprintf("%s:%d", n.ID, r.gpu), ""
	case chainCPUs:
		return WhyCPUs, n.ID, ""
	default:
		return WhyConstraint, n.ID, ""
	}
	if en := tg.entry; en != nil && en.counts[ci] != nil && en.placed[ci][gi] >= en.counts[ci][gi] {
		return WhyPool, n.ID, "" // the pool's worker_counts are full here
	}
	var uuids []string
	if n.hasUUIDs() && len(w.GPUUUIDs) == len(w.GPUs) {
		uuids = w.GPUUUIDs // checked equal to the node's by keepGPU
	}
	e.record(tg, at, e.mut(at), seat{c: ci, index: w.Index, gi: gi, g: g, gpus: w.GPUs, uuids: uuids, frac: frac, cpus: cpus})
	return "", "", ""
}

// keepGPU checks the i-th GPU of w on ns: it exists, is healthy, is the
// same GPU (by UUID) and lies in the pool's allocation; whether the
// worker still fits there is the chain's to say (feasible).
// WhyPreempted: another plan holds it (keepOne names which).
func (e *engine) keepGPU(ns *nodeState, tg target, ci comp, w *plan.Worker, i int) string {
	x, n := w.GPUs[i], ns.node
	switch {
	case x < 0 || x >= n.GPUs:
		return WhyGPUGone
	case n.drained(x):
		return WhyDrained
	case !n.Healthy(x):
		return WhyUnhealthy
	case ns.holder(x) != "":
		return WhyPreempted
	case n.hasUUIDs() && i < len(w.GPUUUIDs) && w.GPUUUIDs[i] != n.GPUUUIDs[x]:
		// A GPU swapped for another in the same slot is not the GPU the
		// worker was told about.
		return WhyGPUReplaced
	case slices.Contains(w.GPUs[:i], x):
		return WhyConflict
	case tg.entry != nil && !slices.Contains(tg.entry.alloc[ci], x):
		return WhyPool
	}
	return ""
}

// targetOf is the pool w belongs in on node at: its component's auto
// pool, or the manual pool it names if that pool still lists the node.
func (e *engine) targetOf(w *plan.Worker, ci comp, at int32) (target, bool) {
	if !e.rules.manual {
		p := e.pools[e.rules.pool[ci]]
		return target{pool: p}, w.Pool == p.name
	}
	p, en := e.entryOf(w.Pool, at)
	return target{pool: p, entry: en}, en != nil
}

// keepReserve keeps GPU g of node at reserved for a buffer if it still
// can be: it is there and healthy, and neither train nor a component that
// may not share with train holds it (under colocate, eval and env may
// share a reserved GPU, as they share train's).
func (e *engine) keepReserve(at int32, g int) bool {
	ns := e.table[at]
	// A reserved GPU is train's: it must be free for a whole train worker.
	if g < 0 || g >= ns.node.GPUs || !ns.freeGPU(g) || !e.fits(ns, compTrain, g, 1) {
		return false
	}
	ns = e.mut(at)
	tp := e.pools[e.rules.pool[compTrain]]
	joined := !e.member(ns, tp.auto)
	if ns.wholly(g) {
		ns.free--
	}
	ns.reserve(g, &e.extras)
	if joined {
		tp.join(at)
	}
	return true
}

// adoptSlow starts from a plan document alone (read back from JSON, or
// made for another spec): every node has a new state and every worker of
// prev is checked again. It costs in proportion to the plan's workers.
func (e *engine) adoptSlow() {
	for _, p := range e.pools {
		for _, pl := range e.prev.Pools {
			if p.auto >= 0 && pl.Name == p.name {
				for _, pn := range pl.Nodes.All() {
					if at := e.find(pn.NodeID); at >= 0 {
						p.order = append(p.order, at)
					}
				}
			}
		}
	}
	byNode, seen := e.prevByNode()
	for at, ws := range byNode {
		for _, w := range ws {
			if why, where, by := e.keepOne(int32(at), w); why != "" {
				e.displace(w, why, where, by)
			}
		}
	}
	e.returnUnplaced(seen)
	e.keepPrevReserve(byNode)
	for _, d := range e.demands {
		ci := d.ci
		for i := range d.asked {
			if !seen[ci][i] {
				e.displaced = append(e.displaced, Displaced{Component: d.comp, Index: i, Why: WhyNew})
			}
		}
	}
	for _, d := range e.demands {
		ci := d.ci
		d.only(e.displacedOf(ci))
	}
	for at, ns := range e.table {
		if e.roomFor(ns, allComps) {
			e.room = append(e.room, int32(at))
		}
	}
}

// prevByNode groups the previous plan's train, eval and env workers by
// node, once per component and index the spec still asks for; workers on
// nodes that left are displaced, and buffers remembered by node.
func (e *engine) prevByNode() ([][]*plan.Worker, [nComp][]bool) {
	byNode := make([][]*plan.Worker, len(e.table))
	var seen [nComp][]bool
	for _, d := range e.demands {
		ci := d.ci
		seen[ci] = make([]bool, d.asked)
	}
	// A degraded plan's buffers are numbered with those of its unplaced
	// train workers, which are unplaced too and keep their indices.
	nbuf := 0
	for _, w := range e.prev.Workers.All() {
		if w.Component == plan.Buffer {
			nbuf++
		}
	}
	for _, u := range e.prev.Unplaced {
		if u.Component == plan.Buffer {
			nbuf++
		}
	}
	e.prevBuffers = slices.Repeat([]int32{-1}, nbuf)
	e.prevBufferIDs = make([]string, nbuf)
	for _, u := range e.prev.Unplaced {
		if u.Component == plan.Buffer && u.Index >= 0 && u.Index < nbuf {
			e.prevBufferIDs[u.Index] = u.NodeID
			e.prevBuffers[u.Index] = e.find(u.NodeID)
		}
	}
	for _, w := range e.prev.Workers.All() {
		ci := w.Component.Rank()
		at := e.find(w.NodeID)
		if w.Component == plan.Buffer {
			if w.Index >= 0 && w.Index < nbuf {
				e.prevBufferIDs[w.Index] = w.NodeID
				if at >= 0 {
					e.prevBuffers[w.Index] = at
				}
			}
			continue
		}
		if ci < 0 || ci >= nComp || w.Index < 0 || w.Index >= e.demands[ci].asked || seen[ci][w.Index] {
			continue
		}
		seen[ci][w.Index] = true
		if at < 0 {
			e.displace(w, WhyNodeLeft, w.NodeID, "")
			continue
		}
		byNode[at] = append(byNode[at], w)
	}
	return byNode, seen
}

// keepPrevReserve keeps the GPUs the previous plan reserved for a buffer
// that uses CUDA (train allocation GPUs no train worker of it held) where
// they still can be, and owes the rest.
func (e *engine) keepPrevReserve(byNode [][]*plan.Worker) {
	if e.reserve == 0 || e.rules.manual {
		return
	}
	name := e.rules.names[e.rules.pool[compTrain]]
	for _, p := range e.prev.Pools {
		if p.Name != name {
			continue
		}
		seen := map[int32]bool{}
		for _, pn := range p.Nodes.All() {
			at := e.find(pn.NodeID)
			if at < 0 || seen[at] {
				continue
			}
			seen[at] = true
			// The document lists a GPU in train's allocation where train
			// holds more than eps of it or it is reserved (autoNode): one
			// listed that train's workers hold eps or less of (a share
			// of eps or less holds no GPU) is reserved, as the plan's
			// state says.
			held := map[int]float64{}
			for _, w := range byNode[at] {
				if w.Component == plan.Train {
					for _, g := range w.GPUs {
						held[g] += w.GPUShare
					}
				}
			}
			for _, r := range pn.Allocations[plan.Train] {
				// The document may be anyone's: bound the walk by the node.
				for g := max(r.First, 0); g <= min(r.Last, e.table[at].node.GPUs-1) && e.reserve > 0; g++ {
					if held[g] <= eps && e.keepReserve(at, g) {
						e.reserve--
					}
				}
			}
		}
	}
}

// roomAfterAdopt is the nodes with room once the previous plan's workers
// are kept: those the previous plan had, less the ones this run changed,
// plus the changed and new ones that have room.
func (e *engine) roomAfterAdopt(prevRoom, remap []int32) []int32 {
	touched := make(map[int32]bool, len(e.touched))
	for _, at := range e.touched {
		touched[at] = true
	}
	out := make([]int32, 0, len(prevRoom)+len(e.touched))
	for _, at := range remapAll(prevRoom, remap) {
		if at >= 0 && !touched[at] {
			out = append(out, at)
		}
	}
	for _, at := range e.touched {
		if e.roomFor(e.table[at], allComps) {
			out = append(out, at)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
