package planner

import (
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// An elastic group's size changes more often than anything else about a
// spec: every trial of PlanAllWith's search, every growth step. A run
// whose previous plan's state was made for the same spec but for its
// elastic sizes starts from that state (adoptFast) as a run of the same
// spec would: the nodes hosting the workers a smaller size drops are
// read again without them (keepNode), the workers a larger size adds are
// placed as new, and every other node keeps its state untouched. Worker
// slots are numbered train, eval, env, then buffers: this holds only
// where the resized groups' slots come last (no component's first slot
// moves), so that every kept worker keeps its slot; buffers, which
// follow, are moved as a block.

// prevLayout is, for a run that may start from a previous state of
// another size, how many workers each component had there and where its
// slots began; ok reports whether this run may start from it (resized),
// which readAll then refuses (run: keepNotes).
func (e *engine) prevLayout() (asked, base [nComp]int, slots int, ok bool) {
	if e.prevState == nil {
		return asked, base, 0, false
	}
	return e.layoutOf(e.prevState.spec)
}

// layoutOf is prevLayout for a previous plan made for spec ps.
func (e *engine) layoutOf(ps *Spec) (asked, base [nComp]int, slots int, ok bool) {
	if ps.Placement.Mode == ModeManual || e.rules.manual {
		return asked, base, 0, false
	}
	refs := elasticRefs(e.spec)
	if len(refs) == 0 || !sameShape(elasticRefs(ps), refs) {
		return asked, base, 0, false
	}
	if !specEqual(sized(ps, specCounts(e.spec, refs)), e.spec) {
		return asked, base, 0, false
	}
	sc := ps.Scheduling
	for ci, groups := range [nComp][]WorkerGroup{groupList(sc.Train), groupList(sc.Eval), sc.Env} {
		base[ci] = slots
		for _, g := range groups {
			asked[ci] += max(g.WorkerNum, 0)
		}
		slots += asked[ci]
		if (asked[ci] > 0 || e.demands[ci].asked > 0) && base[ci] != e.base[ci] {
			return asked, base, 0, false // a later component's slots would move
		}
	}
	return asked, base, slots, true
}

// specCounts is the sizes spec gives refs (its elastic groups).
func specCounts(s *Spec, refs []elasticRef) []int {
	out := make([]int, len(refs))
	for k, r := range refs {
		if r.c == plan.Eval {
			out[k] = s.Scheduling.Eval.WorkerNum
		} else {
			out[k] = s.Scheduling.Env[r.gi].WorkerNum
		}
	}
	return out
}

// dropped reports whether slot s of the previous plan holds a worker
// this run's sizes no longer ask for (buffers, past the worker slots,
// never are).
func (e *engine) dropped(s int) bool {
	if !e.resized || s >= e.prevSlots {
		return false
	}
	for ci := range comp(nComp) {
		if s >= e.prevBase[ci] && s < e.prevBase[ci]+e.prevAsked[ci] {
			return s-e.prevBase[ci] >= e.demands[ci].asked
		}
	}
	return false
}

// dropNodes marks the positions in the previous table of the nodes that
// host a dropped worker: they are read again without it.
func (e *engine) dropNodes() []bool {
	if !e.resized {
		return nil
	}
	var force []bool
	table := e.prevState.table
	last := ""
	for ci := range comp(nComp) {
		for s := e.prevBase[ci] + e.demands[ci].asked; s < e.prevBase[ci]+e.prevAsked[ci]; s++ {
			id := e.prev.Workers.At(s).NodeID
			if id == last {
				continue
			}
			last = id
			i, ok := slices.BinarySearchFunc(table, id, func(ns *nodeState, id string) int { return strings.Compare(ns.node.ID, id) })
			if !ok {
				continue // a node that left: its workers go with it
			}
			if force == nil {
				force = make([]bool, len(table))
			}
			force[i] = true
		}
	}
	return force
}

// moveBuffers puts the previous plan's buffers after this run's worker
// slots, where a resized run's store has them, and clears the slots the
// grown groups are still to fill.
func (e *engine) moveBuffers() {
	if e.prevSlots == e.slots {
		return
	}
	n := e.prev.Workers.Len() - e.prevSlots
	bufs := make([]plan.Worker, n)
	for k := range bufs {
		bufs[k] = *e.prev.Workers.At(e.prevSlots + k)
	}
	e.store.resize(e.slots + n)
	for s := e.prevSlots; s < min(e.slots, e.slots+n); s++ {
		e.store.set(s, plan.Worker{})
	}
	for k, w := range bufs {
		e.store.set(e.slots+k, w)
	}
}

// newWorkers lists as new the workers the grown groups add.
func (e *engine) newWorkers() {
	if !e.resized {
		return
	}
	for _, d := range e.demands {
		for i := e.prevAsked[d.ci]; i < d.asked; i++ {
			e.displaced = append(e.displaced, Displaced{Component: d.comp, Index: i, Why: WhyNew})
		}
	}
}

// cutFast is prev, a valid plan made with its run's state, cut to spec
// (prev's spec at smaller elastic sizes, or, for a group spec asks more
// of, the size prev has) by an incremental run on the nodes prev was made
// on: the nodes of the workers dropped are read again, every other keeps
// its state, so the next run starts from it as from prev (adoptFast).
// The result is truncated's, carrying prev's header, demands and spec as
// truncated sets them; nil where no such run can be made (then truncated
// reads every worker).
func cutFast(prev *Plan, refs []elasticRef, counts []int, spec *Spec) *Plan {
	st := prev.state
	if st == nil || prev.PlanState() != plan.StateValid || len(prev.Unplaced) > 0 {
		return nil
	}
	held := heldCounts(prev, refs)
	at := slices.Clone(counts)
	for k := range at {
		if held[k] < 0 {
			return nil
		}
		at[k] = min(at[k], held[k])
	}
	e := newEngine(sized(spec, at), Options{})
	e.prev, e.prevState, e.keepOnly = prev, st, true
	nodes := st.nodes
	if nodes == nil {
		// Its states' nodes as they are: a copy of every node (5.6 MB
		// at 20,000) for a run that reads them once.
		e.onStates = st.table
	}
	err := e.run(nodes)
	e.onStates = nil
	if err != nil || !e.fast || len(e.displaced) > 0 {
		return nil
	}
	doc, err := e.finish(nil)
	if err != nil {
		return nil
	}
	out := *prev
	out.Workers, out.Pools, out.ResourcePool = doc.Workers, doc.Pools, doc.ResourcePool
	out.StorageToTrainWorkers = doc.StorageToTrainWorkers
	out.Unplaced = nil
	out.Demands = demandsOf(spec)
	out.state, out.afresh, out.takenBy, out.releasedAs, out.notesFrom = doc.state, nil, nil, nil, nil
	if prev.spec != nil {
		out.spec = spec
	}
	if base := heldOf(prev); base != nil {
		h := patchHeld(&out, base)
		out.state.held.Store(&h)
		shareDense(&out, prev, h, base)
	}
	return &out
}

// heldOf is p's holding by id as its state keeps it, computed and kept
// there first if need be (nil: p has no state to keep it in).
func heldOf(p *Plan) []*idHold {
	if p == nil || p.state == nil {
		return nil
	}
	if h := p.state.held.Load(); h != nil {
		return *h
	}
	h := scanHeld(p)
	p.state.held.Store(&h)
	return h
}

// seedHeld keeps with doc, made by a run that started from cur's state,
// its holding patched from cur's, when cur's is known: the allocator
// finds a base only among the jobs' previous plans, and growth makes
// plan after plan from the one before.
func seedHeld(doc, cur *Plan) {
	if doc == nil || cur == nil || doc.state == nil || cur.state == nil || doc.state.from != cur.state.token || len(doc.Unplaced) > 0 {
		return
	}
	if doc.state.held.Load() != nil {
		return
	}
	if h := cur.state.held.Load(); h != nil {
		out := patchHeld(doc, *h)
		doc.state.held.Store(&out)
		shareDense(doc, cur, out, *h)
	}
}

// keptAll is keepsAll for doc made by a run that started from cur's
// state (ch its change): only its displaced workers can have moved.
func keptAll(cur, doc *Plan, ch *Change) bool {
	if doc.state == nil || cur.state == nil || doc.state.from != cur.state.token || ch == nil || ch.Fresh ||
		len(doc.state.buffers) < len(cur.state.buffers) {
		return keepsAll(cur, doc)
	}
	for _, d := range ch.Displaced {
		if d.Why == WhyNew {
			continue
		}
		w := cur.Workers.Find(d.Component, d.Index)
		if w == nil {
			continue
		}
		if o := doc.Workers.Find(d.Component, d.Index); o == nil || !samePlace(o, w) {
			return false
		}
	}
	return true
}

// keepNotes gives the nodes of a run that reads every worker of its
// previous plan again (adoptSlow) where adoptFast would have started
// from a state of that plan (from: its nodes' states) the notes
// adoptFast keeps: those of every node whose facts are the ones that
// state saw and that hosts no worker this run's sizes drop, the nodes
// adoptFast keeps untouched (merge, dropNodes). Without them a plan grown
// or cut through the documents (readAll) lost, say, the "held by plan
// t4" of the nodes its elastic eval could not use, which the same plan
// made from its state keeps (TestElasticLargeAgrees). Called before any
// pass, so that the notes this run makes follow them, as in a state
// adoptFast kept.
func (e *engine) keepNotes(from []*nodeState) {
	drops := e.dropsOn()
	for _, ns := range e.table {
		i, ok := slices.BinarySearchFunc(from, ns.node.ID, func(old *nodeState, id string) int { return strings.Compare(old.node.ID, id) })
		if !ok || drops[ns.node.ID] || !sameMachine(from[i].node, ns.node) || !from[i].mark().equal(ns.mark()) {
			continue
		}
		for _, n := range from[i].notes() {
			ns.note(n.comp, n.reason, &e.extras)
		}
	}
}

// dropsOn is the nodes hosting a worker of the previous plan that this
// run's spec no longer asks for (nil: none).
func (e *engine) dropsOn() map[string]bool {
	var out map[string]bool
	for _, w := range e.prev.Workers.All() {
		r := w.Component.Rank()
		if r < 0 || r >= nComp || w.Index < e.demands[r].asked {
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[w.NodeID] = true
	}
	return out
}

// notesKept is what a plan cut from every worker of prev (truncated)
// keeps of prev's node states for the next run's notes (Plan.notesFrom):
// those of the nodes hosting none of the workers drop cuts, the states
// cutFast's plan keeps untouched; nil where prev has none.
func notesKept(prev *Plan, drop func(plan.Component, int) bool) []*nodeState {
	from := prev.notesFrom
	if prev.state != nil {
		from = prev.state.table
	}
	if from == nil {
		return nil
	}
	cut := map[string]bool{}
	for _, w := range prev.Workers.All() {
		if drop(w.Component, w.Index) {
			cut[w.NodeID] = true
		}
	}
	return slices.DeleteFunc(slices.Clone(from), func(ns *nodeState) bool { return cut[ns.node.ID] })
}
