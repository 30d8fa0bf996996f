package planner

import (
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Diff is what next changes of prev's placement, node by node: the change
// a revision event carries, which plan.Replay applies. When next was made
// from prev's state it reads only the nodes that run touched; otherwise
// (prev read back from JSON, a fresh plan, manual pools) it compares the
// two documents node by node. prev may be nil: every node is new.
func Diff(prev, next *Plan) *plan.Change {
	ch := &plan.Change{Export: plan.ExportOptionsOf(next.ResourcePool), Nodes: []plan.NodeChange{}}
	var ids []string
	var content func(id string) plan.NodeChange
	if prev != nil && prev.state != nil && next.state != nil && next.state.from == prev.state.token && !next.state.spec.isManual() {
		ids = next.state.changedIDs()
		content = next.state.nodeContent(next)
	} else {
		var now nodeIndex
		ids, now = changedNodes(prev, next)
		content = now.content
	}
	for _, id := range ids {
		ch.Nodes = append(ch.Nodes, content(id))
	}
	ch.Pools = poolOrders(prev, next)
	return ch
}

func (s *Spec) isManual() bool { return s.Placement.Mode == ModeManual }

// changedIDs are the ids of the nodes the run may have changed, and of
// those that left, once each, sorted.
func (st *runState) changedIDs() []string {
	out := slices.Clone(st.gone)
	for _, at := range st.changed {
		out = append(out, st.table[at].node.ID)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nodeContent returns what a node holds in p, read from the run's state:
// its workers by their slots, its buffer, its auto pool entries, its
// notes. A node not in the table holds nothing.
func (st *runState) nodeContent(p *Plan) func(id string) plan.NodeChange {
	bufferOf := st.bufferIndex()
	slots := p.Workers.Len() - len(st.buffers)
	return func(id string) plan.NodeChange {
		nc := plan.NodeChange{NodeID: id}
		i, ok := slices.BinarySearchFunc(st.table, id, func(ns *nodeState, id string) int {
			return strings.Compare(ns.node.ID, id)
		})
		if !ok {
			return nc
		}
		ns := st.table[i]
		for _, r := range sortedSlots(ns.slots()) {
			for s := r.first; s < r.first+r.n; s++ {
				nc.Workers = append(nc.Workers, *p.Workers.At(int(s)))
			}
		}
		if k, ok := bufferOf[int32(i)]; ok {
			nc.Workers = append(nc.Workers, *p.Workers.At(slots + k))
		}
		for a, name := range st.names {
			if pn := ns.doc(a); pn != nil {
				if nc.Pools == nil {
					nc.Pools = map[string]plan.PoolNode{}
				}
				nc.Pools[name] = *pn
			}
		}
		for _, n := range ns.notes() {
			nc.Notes = append(nc.Notes, plan.Note{NodeID: id, Component: n.comp, Reason: n.reason})
		}
		return nc
	}
}

// bufferIndex maps a node's position to its buffer's index, built once:
// lookups by node ask it at every request.
func (st *runState) bufferIndex() map[int32]int {
	st.bufferOnce.Do(func() {
		st.bufferOf = make(map[int32]int, len(st.buffers))
		for k, at := range st.buffers {
			st.bufferOf[at] = k
		}
	})
	return st.bufferOf
}

func sortedSlots(rs []slotRange) []slotRange {
	return slices.SortedFunc(slices.Values(rs), func(a, b slotRange) int { return int(a.first - b.first) })
}

// nodeIndex is a document's placement node by node. It holds where each
// node's workers sit in the document, not copies of them: two plans of
// 400,000 workers copied so were some 200 MB, at every restart's first
// replan (prev read back from JSON).
type nodeIndex struct {
	p     *Plan
	nodes map[string]*nodeEntry
}

// nodeEntry is one node of a nodeIndex: its workers' positions in the
// document, in document order, its pool entries and its notes.
type nodeEntry struct {
	workers []int32
	pools   map[string]plan.PoolNode
	notes   []plan.Note
}

// indexNodes indexes p's workers, pool entries and notes by node.
func indexNodes(p *Plan) nodeIndex {
	x := workersByNode(p)
	if p == nil {
		return x
	}
	node := func(id string) *nodeEntry {
		n := x.nodes[id]
		if n == nil {
			n = &nodeEntry{}
			x.nodes[id] = n
		}
		return n
	}
	for _, pl := range p.Pools {
		for _, pn := range pl.Nodes.All() {
			n := node(pn.NodeID)
			if n.pools == nil {
				n.pools = map[string]plan.PoolNode{}
			}
			n.pools[pl.Name] = *pn
		}
	}
	for _, note := range p.Notes {
		n := node(note.NodeID)
		n.notes = append(n.notes, note)
	}
	return x
}

// workersByNode indexes p's workers alone by node.
func workersByNode(p *Plan) nodeIndex {
	x := nodeIndex{p: p, nodes: map[string]*nodeEntry{}}
	if p == nil {
		return x
	}
	// Counted first, so that every node's positions are a window of one
	// array rather than each a slice grown by appending.
	count := map[string]int32{}
	for _, w := range p.Workers.All() {
		count[w.NodeID]++
	}
	slab := make([]int32, 0, p.Workers.Len())
	for id, c := range count {
		x.nodes[id] = &nodeEntry{workers: slab[len(slab) : len(slab) : len(slab)+int(c)]}
		slab = slab[:len(slab)+int(c)]
	}
	for i, w := range p.Workers.All() {
		n := x.nodes[w.NodeID]
		n.workers = append(n.workers, int32(i))
	}
	return x
}

// content is node id's workers (copied out of the document), pool
// entries and notes.
func (x nodeIndex) content(id string) plan.NodeChange {
	n := x.nodes[id]
	if n == nil {
		return plan.NodeChange{NodeID: id}
	}
	nc := plan.NodeChange{NodeID: id, Pools: n.pools, Notes: n.notes}
	if len(n.workers) > 0 {
		nc.Workers = make([]plan.Worker, len(n.workers))
		for i, k := range n.workers {
			nc.Workers[i] = *x.p.Workers.At(int(k))
		}
	}
	return nc
}

// changedNodes compares two documents node by node: the ids, sorted, of
// the nodes whose workers, pool entries or notes differ, and next's index.
func changedNodes(prev, next *Plan) ([]string, nodeIndex) {
	was, now := indexNodes(prev), indexNodes(next)
	var ids []string
	for id, n := range now.nodes {
		if !sameNode(was, was.nodes[id], now, n) {
			ids = append(ids, id)
		}
	}
	for id := range was.nodes {
		if now.nodes[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, now
}

// sameNode compares node entry a of index xa with entry b of xb.
func sameNode(xa nodeIndex, a *nodeEntry, xb nodeIndex, b *nodeEntry) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.workers) != len(b.workers) || !slices.Equal(a.notes, b.notes) || len(a.pools) != len(b.pools) {
		return false
	}
	for i := range a.workers {
		if !SameWorker(*xa.p.Workers.At(int(a.workers[i])), *xb.p.Workers.At(int(b.workers[i]))) {
			return false
		}
	}
	for name, pa := range a.pools {
		if pb, ok := b.pools[name]; !ok || !samePoolNode(pa, pb) {
			return false
		}
	}
	return true
}

// poolOrders is every pool of next, in order, with how its node order
// changed from prev's pool of that name: nodes dropped and nodes added at
// the end, as an incremental plan changes it; or the order whole.
func poolOrders(prev, next *Plan) []plan.PoolOrder {
	before := map[string]plan.PoolNodes{}
	if prev != nil {
		for _, pl := range prev.Pools {
			before[pl.Name] = pl.Nodes
		}
	}
	out := make([]plan.PoolOrder, 0, len(next.Pools))
	for _, pl := range next.Pools {
		out = append(out, poolOrder(pl.Name, before[pl.Name], pl.Nodes))
	}
	return out
}

// poolOrder is how a pool's node order changed from was to now: the
// nodes of was not in now dropped and the rest of now added at the end,
// where now is was so changed; else now whole. It walks the two in step
// and looks up only the nodes dropped or added (a node's loss: one), not
// every node of the pool in a map: 20,000 nodes' maps, built for every
// pool at every revision, were milliseconds of each.
func poolOrder(name string, was, now plan.PoolNodes) plan.PoolOrder {
	po := plan.PoolOrder{Name: name}
	k := 0 // nodes of now matched, in order, by nodes of was kept
	for _, n := range was.All() {
		if k < now.Len() && now.At(k).NodeID == n.NodeID {
			k++
			continue
		}
		po.Drop = append(po.Drop, n.NodeID)
	}
	// A node taken for dropped that now holds after all was moved.
	if len(po.Drop) > 0 {
		dropped := make(map[string]bool, len(po.Drop))
		for _, id := range po.Drop {
			dropped[id] = true
		}
		for _, n := range now.All() {
			if dropped[n.NodeID] {
				return wholeOrder(name, now)
			}
		}
	}
	if k < now.Len() {
		added := make(map[string]bool, now.Len()-k)
		for i := k; i < now.Len(); i++ {
			added[now.At(i).NodeID] = true
		}
		for _, n := range was.All() {
			if added[n.NodeID] {
				return wholeOrder(name, now)
			}
		}
		for i := k; i < now.Len(); i++ {
			po.Add = append(po.Add, now.At(i).NodeID)
		}
	}
	return po
}

func wholeOrder(name string, now plan.PoolNodes) plan.PoolOrder {
	po := plan.PoolOrder{Name: name, Nodes: make([]string, now.Len())}
	for i, n := range now.All() {
		po.Nodes[i] = n.NodeID
	}
	return po
}

// NodeIndex returns OnNode for many nodes: from the run's state when p
// has one, else from an index of every worker built once.
func (p *Plan) NodeIndex() func(id string) []plan.Worker {
	if p.state != nil {
		content := p.state.nodeContent(p)
		return func(id string) []plan.Worker { return content(id).Workers }
	}
	// Positions, not copies: a plan read back holds 400,000 workers, and
	// a copy of each, by node, was 55 MB more while a restarted planner
	// reconciles its assignments; each call copies out its node's.
	x := workersByNode(p)
	return func(id string) []plan.Worker { return x.content(id).Workers }
}

// OnNode lists the workers p places on node id, buffers last: from the
// run's state when p has one, else by reading every worker.
func (p *Plan) OnNode(id string) []plan.Worker {
	if p.state != nil {
		return p.state.nodeContent(p)(id).Workers
	}
	var out []plan.Worker
	for _, w := range p.Workers.All() {
		if w.NodeID == id {
			out = append(out, *w)
		}
	}
	return out
}
