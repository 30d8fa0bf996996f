package planner

import (
	"errors"
	"math/bits"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// finish makes the run's plan document. A run that failed gives a
// document with the error, the explanations, the demands and no
// placement; a valid one gives the workers, buffers, pools and export, and
// keeps its state for the next incremental run.
func (e *engine) finish(err error) (*Plan, error) {
	var short *shortfallError
	if errors.As(err, &short) {
		err = short.error
	}
	sp := e.spec.Placement
	doc := &Plan{Document: plan.Document{
		Header: plan.Header{
			Mode:        sp.Mode,
			Strategy:    sp.Strategy,
			EnvStrategy: sp.EnvStrategy,
			Demands:     e.demandsDoc(),
			Capacity:    e.cap,
		},
		Placement: plan.Placement{
			ResourcePool:          []plan.PoolExport{},
			Pools:                 []plan.Pool{},
			StorageToTrainWorkers: map[string][]int{},
		},
	}}
	if sp.Mode == ModeManual {
		doc.Strategy, doc.EnvStrategy = "", ""
	}
	doc.spec = e.spec
	if err != nil {
		e.invalid = true
		doc.Error = err.Error()
		doc.Status = plan.Status{State: plan.StateInvalid, Reason: plan.ReasonSpec, Cause: doc.Error}
		doc.Explanations = e.explain()
		doc.Notes = e.notesDoc()
		return doc, err
	}
	doc.Status = plan.Status{State: plan.StateValid}
	doc.StorageToTrainWorkers, e.bufferMoves = e.placeBuffers()
	if e.store != nil {
		doc.Workers = e.store.workers()
	}
	var order [][]int32
	doc.Pools, order = e.poolsDoc()
	var prevExport []exportedPool
	if e.prevState != nil {
		prevExport = e.prevState.exported
	}
	doc.ResourcePool, e.exported = exportPools(doc.Pools, order, e.table, e.exportCounts(), e.byUnits(), prevExport)
	doc.Explanations = e.explain()
	doc.Notes = e.notesDoc()
	doc.Warnings = e.warnings
	if e.store != nil {
		doc.state = e.save()
		if e.prevState != nil {
			// Known only from a previous list known in order: a plan
			// made afresh is walked, if ever, when CountMoved asks.
			if was := e.prevState.ordered.Load(); was != nil && was.in {
				doc.state.ordered.Store(&orderProof{ws: doc.Workers, in: workersInOrder(doc.Workers, was.ws)})
			}
		}
	}
	return doc, nil
}

// poolsDoc lays out the pools: an auto pool's nodes in the previous
// plan's order, then those that joined in this run, each with exactly the
// GPUs its components hold (and train's reserve); a manual pool's nodes
// as the spec lists them, with the ranges it gives. It returns each
// listed pool's node positions too.
func (e *engine) poolsDoc() ([]plan.Pool, [][]int32) {
	pools := []plan.Pool{}
	var order [][]int32
	for _, p := range e.pools {
		var nodes plan.PoolNodes
		if p.auto < 0 {
			var list []plan.PoolNode
			for _, en := range p.entries {
				p.final = append(p.final, en.at)
				list = append(list, e.manualNode(en))
			}
			nodes = plan.NewPoolNodes(list)
		} else {
			p.final = e.poolOrder(p)
			if same, ok := e.unchangedPool(p); ok {
				p.rendered = same
				pools = append(pools, plan.Pool{Name: p.name, Nodes: same})
				order = append(order, p.final)
				continue
			}
			nodes = e.renderPool(p)
			p.rendered = nodes
		}
		if nodes.Len() > 0 {
			pools = append(pools, plan.Pool{Name: p.name, Nodes: nodes})
			order = append(order, p.final)
		}
	}
	return pools, order
}

// renderPool is auto pool p's entries, in chunks (plan.PoolNodes): a
// chunk whose every entry this run renders as the previous plan did (the
// same node at each position, its state untouched, sharedChunk) is the
// previous plan's chunk itself; the others are rendered. A grow or a
// shrink of one worker in a pool of 15,000 nodes renders one chunk of
// 256 entries, not a list of 2.8 MB.
func (e *engine) renderPool(p *poolRun) plan.PoolNodes {
	n := len(p.final)
	var prev plan.PoolNodes
	var prevOrder []int32
	if st := e.prevState; st != nil && len(e.table) == len(st.table) {
		prev, prevOrder = st.rendered[p.auto], st.order[p.auto]
	}
	// The entries this run makes are kept on their nodes in a slab of
	// their own: pointing into the chunks would keep this whole document
	// alive while one of its nodes stays untouched.
	made := 0
	for _, at := range p.final {
		if e.table[at].doc(p.auto) == nil {
			made++
		}
	}
	kept := make([]plan.PoolNode, 0, made)
	var slab []plan.Range
	chunks := make([][]plan.PoolNode, 0, (n+plan.PoolChunkLen-1)/plan.PoolChunkLen)
	for from := 0; from < n; from += plan.PoolChunkLen {
		to := min(from+plan.PoolChunkLen, n)
		if c := e.sharedChunk(p, prev, prevOrder, from, to); c != nil {
			chunks = append(chunks, c)
			continue
		}
		c := make([]plan.PoolNode, to-from)
		for i := from; i < to; i++ {
			slab = e.autoNode(p.final[i], p.auto, &c[i-from], slab, &kept)
		}
		chunks = append(chunks, c)
	}
	return plan.PoolNodesFromChunks(chunks, n)
}

// sharedChunk is prev's chunk of pool positions [from, to) where this
// run renders each of its entries as prev did: the same node at each
// position as in prev's order, its state the one prev had there with its
// entry cached (entryAsBefore), the entry prev's chunk holds; nil where
// any differs.
func (e *engine) sharedChunk(p *poolRun, prev plan.PoolNodes, prevOrder []int32, from, to int) []plan.PoolNode {
	k := from / plan.PoolChunkLen
	if prev.IsNil() || k >= len(prev.Chunks()) || to > len(prevOrder) {
		return nil
	}
	c := prev.Chunks()[k]
	if len(c) != to-from {
		return nil
	}
	for i := from; i < to; i++ {
		at := p.final[i]
		if prevOrder[i] != at || e.entryAt(at, p.auto, &c[i-from]) != entryAsBefore {
			return nil
		}
	}
	return c
}

// entryKind is how table position at's state stands to the previous
// plan's entry of it in one auto pool (unchangedPool).
type entryKind int

const (
	entryAsBefore  entryKind = iota // untouched, its entry cached: the one rendered then
	entryMadeAgain                  // made again by this run: to be rendered and compared
	entryDiffers                    // another node, or a state that renders anew
)

// entryAt is how position at's state stands to was, the previous
// plan's entry at the same place of auto pool auto.
func (e *engine) entryAt(at int32, auto int, was *plan.PoolNode) entryKind {
	ns := e.table[at]
	switch {
	case was.NodeID != ns.node.ID:
		return entryDiffers
	case ns == e.prevState.table[at] && ns.doc(auto) != nil:
		return entryAsBefore
	case ns.owner == e.token && ns.doc(auto) == nil:
		return entryMadeAgain
	}
	return entryDiffers
}

// unchangedPool is the previous plan's entries of auto pool p where
// this run renders them exactly so: at the same positions, in the same
// order, the same states (untouched, each with its entry cached, so the
// entry is the one rendered then), or states this run made again whose
// entries render as the previous ones (a node read again for another
// plan's hold on it: a shrink's taker on a GPU beside this plan's
// workers). A plan's documents are never written in place, so the two
// plans share the list; ok false where any of it differs.
func (e *engine) unchangedPool(p *poolRun) (_ plan.PoolNodes, ok bool) {
	st := e.prevState
	if st == nil || len(e.table) != len(st.table) {
		return plan.PoolNodes{}, false
	}
	prev := st.rendered[p.auto]
	if prev.Len() == 0 || prev.Len() != len(p.final) || !slices.Equal(p.final, st.order[p.auto]) {
		return plan.PoolNodes{}, false
	}
	// The states this run made or copied, where few, are looked at
	// first, as the walk below looks at each: one that is not as before
	// ends it here, before the walk over 15,000 entries that would end
	// at it (a grow's or a shrink's node is mostly near the pool's end).
	if len(e.touched) <= touchedFirst {
		for _, at := range e.touched {
			i := slices.Index(p.final, at)
			if i < 0 {
				continue
			}
			switch e.entryAt(at, p.auto, prev.At(i)) {
			case entryDiffers:
				return plan.PoolNodes{}, false
			case entryMadeAgain:
				var made plan.PoolNode
				var none []plan.PoolNode // kept nowhere: rendered only to compare
				e.autoNode(at, p.auto, &made, nil, &none)
				if was := prev.At(i); !samePoolNode(made, *was) || (made.Allocations == nil) != (was.Allocations == nil) {
					return plan.PoolNodes{}, false
				}
			}
		}
	}
	var again []int // positions in prev of the states made again
	for i, at := range p.final {
		switch e.entryAt(at, p.auto, prev.At(i)) {
		case entryDiffers:
			return plan.PoolNodes{}, false
		case entryMadeAgain:
			again = append(again, i)
		}
	}
	// Rendered only once every untouched entry was found shared, and
	// kept (each on its node, as autoNode keeps them) only where all are
	// as before.
	made := make([]plan.PoolNode, len(again))
	var slab []plan.Range
	var none []plan.PoolNode // room for none: autoNode keeps nothing yet
	for k, i := range again {
		slab = e.autoNode(p.final[i], p.auto, &made[k], slab, &none)
		// A nil map and an empty one read alike but are written
		// apart (null, {}).
		if was := prev.At(i); !samePoolNode(made[k], *was) || (made[k].Allocations == nil) != (was.Allocations == nil) {
			return plan.PoolNodes{}, false
		}
	}
	for k, i := range again {
		e.table[p.final[i]].ext(&e.extras).doc[p.auto] = &made[k]
	}
	return prev, true
}

// touchedFirst is how many states a run may have made or copied for
// unchangedPool to look at them before its walk: each is searched for in
// the pool's order.
const touchedFirst = 16

// poolOrder is an auto pool's members: the previous plan's order first,
// then the nodes that joined in this run.
func (e *engine) poolOrder(p *poolRun) []int32 {
	out := make([]int32, 0, len(p.order)+len(p.joined))
	var listed []bool
	if len(p.order) > 0 {
		listed = make([]bool, len(e.table))
	}
	for _, at := range p.order {
		if at >= 0 && !listed[at] && e.member(e.table[at], p.auto) {
			listed[at] = true
			out = append(out, at)
		}
	}
	for _, at := range p.joined {
		if (listed == nil || !listed[at]) && e.member(e.table[at], p.auto) {
			out = append(out, at)
		}
	}
	return out
}

// autoNode writes node at's entry in auto pool p to dst, and caches a copy
// (in kept, which has room for it) on the node: a node no run has touched
// since keeps the entry of the plan that made it. Ranges come from slab,
// which it returns grown.
func (e *engine) autoNode(at int32, p int, dst *plan.PoolNode, slab []plan.Range, kept *[]plan.PoolNode) []plan.Range {
	ns := e.table[at]
	if pn := ns.doc(p); pn != nil {
		*dst = *pn
		return slab
	}
	n := ns.node
	*dst = plan.PoolNode{NodeID: n.ID, IP: n.IP, TotalGPUs: n.GPUs, TotalCPUs: n.CPUs, Allocations: make(map[plan.Component][]plan.Range, 2)}
	for ci := range comp(nComp) {
		c := ci.Component()
		if e.rules.pool[ci] != p {
			continue
		}
		if cap(slab)-len(slab) < len(ns.usable) {
			slab = make([]plan.Range, 0, max(256, len(ns.usable)))
		}
		start := len(slab)
		for _, g := range ns.usable {
			if ns.shareOf(ci)[g] > eps || ci == compTrain && ns.resv() != nil && ns.resv()[g] {
				if k := len(slab); k > start && slab[k-1].Last+1 == g {
					slab[k-1].Last = g
				} else {
					slab = append(slab, plan.Range{First: g, Last: g})
				}
			}
		}
		if len(slab) > start {
			dst.Allocations[c] = slab[start:len(slab):len(slab)]
		}
		if ns.count[ci] > 0 {
			counts := make([]int, len(ns.gcountOf(ci)))
			for g, k := range ns.gcountOf(ci) {
				counts[g] = int(k)
			}
			*dst.WorkerCounts.Of(c) = counts
		}
	}
	dst.UnhealthyGPUs = unhealthyOf(n)
	dst.GPUModel, dst.NVLinkDomain = modelOf(n), n.Domain
	if ns.owner == e.token && len(*kept) < cap(*kept) {
		*kept = append(*kept, *dst)
		ns.ext(&e.extras).doc[p] = &(*kept)[len(*kept)-1]
	}
	return slab
}

// manualNode is a manual pool entry as the document shows it.
func (e *engine) manualNode(en *poolEntry) plan.PoolNode {
	n := e.table[en.at].node
	pn := plan.PoolNode{NodeID: n.ID, IP: n.IP, TotalGPUs: n.GPUs, TotalCPUs: n.CPUs, Allocations: make(map[plan.Component][]plan.Range, 3),
		GPUModel: modelOf(n), NVLinkDomain: n.Domain}
	for ci, c := range plan.GPUComponents {
		if len(en.alloc[ci]) > 0 {
			pn.Allocations[c] = plan.RangesOf(en.alloc[ci])
		}
		for _, k := range en.placed[ci] {
			if k > 0 {
				*pn.WorkerCounts.Of(c) = slices.Clone(en.placed[ci])
				break
			}
		}
	}
	pn.UnhealthyGPUs = unhealthyOf(n)
	return pn
}

// unhealthyOf lists the node's unhealthy GPUs in its index space,
// ascending.
func unhealthyOf(n *Node) []int {
	var out []int
	for _, g := range n.Unhealthy {
		if g >= 0 && g < n.GPUs {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// save keeps what the next incremental run needs.
func (e *engine) save() *runState {
	st := &runState{spec: e.spec, table: e.table, nodes: e.nodes, buffers: e.buffers, reserveLeft: e.reserve,
		names: e.rules.names, exported: e.exported, token: e.token, changed: append(e.touched, e.rebuffered...), gone: e.gone}
	if e.fast {
		st.from = e.prevState.token
	}
	for _, p := range e.pools {
		if p.auto >= 0 {
			st.order[p.auto], st.rendered[p.auto] = p.final, p.rendered
		}
	}
	st.room = e.finalRoom()
	return st
}

// finalRoom is the nodes with room in the plan: for a run that started
// from a previous state, its list less the nodes this run touched plus
// those of them with room; else every node is looked at.
func (e *engine) finalRoom() []int32 {
	var out []int32
	if !e.fast {
		// Marked first, then made at its size: grown by append, a list
		// of 20,000 nodes (a small plan's on a free cluster) cost 340 kB
		// for 80.
		marks := make([]uint64, (len(e.table)+63)/64)
		n := 0
		for at, ns := range e.table {
			if e.roomFor(ns, allComps) {
				marks[at/64] |= 1 << (at % 64)
				n++
			}
		}
		if n == 0 {
			return nil
		}
		out = make([]int32, 0, n)
		for w, m := range marks {
			for ; m != 0; m &= m - 1 {
				out = append(out, int32(w*64+bits.TrailingZeros64(m)))
			}
		}
		return out
	}
	touched := make(map[int32]bool, len(e.touched))
	for _, at := range e.touched {
		touched[at] = true
	}
	for _, at := range e.room {
		if !touched[at] {
			out = append(out, at)
		}
	}
	for at := range touched {
		if e.roomFor(e.table[at], allComps) {
			out = append(out, at)
		}
	}
	slices.Sort(out)
	return out
}

// exportCounts says which components the export gives worker_counts (the
// number of their groups; 0 for none): those rlightning's packing of the
// index strings would place otherwise. A fresh plan is that packing, bar
// workers without GPUs, which it has no index string for; an incremental
// plan places where it can keep workers, so every component is counted.
func (e *engine) exportCounts() [nComp]int {
	var out [nComp]int
	for _, d := range e.demands {
		ci := d.ci
		counted := e.prev != nil || e.exactCounts()[ci] || e.byUnits()
		for _, g := range d.groups {
			counted = counted || g.WorkerNum > 0 && g.NumGPUs <= 0
		}
		if counted && d.asked > 0 {
			out[ci] = len(d.groups)
		}
	}
	return out
}

// modelOf is n's GPU model for the document: its models in GPU order,
// each once, joined by "+".
func modelOf(n *Node) string {
	var seen []string
	for _, m := range n.Models {
		if m != "" && !slices.Contains(seen, m) {
			seen = append(seen, m)
		}
	}
	return strings.Join(seen, "+")
}
