package planner

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// rules are what a placement allows, written once: which components may
// share a GPU, and which auto pool each component belongs to. Fresh plans,
// incremental plans and the checks on kept workers all read them here.
type rules struct {
	manual         bool
	colocate       bool
	deviceColocate bool
	// conflict[ci][cj]: components ci and cj may not share a GPU.
	conflict [nComp][nComp]bool
	// pool[ci] is the auto pool of component ci, an index into names;
	// masks[p] has a bit for each component of pool p.
	pool  [nComp]int
	masks [2]uint8
	names []string
}

func newRules(p Placement) rules {
	r := rules{
		manual:         p.Mode == ModeManual,
		colocate:       p.Strategy == StrategyColocate,
		deviceColocate: p.EnvStrategy == EnvStrategyDeviceColocate,
	}
	for ci := range comp(nComp) {
		for cj := range comp(nComp) {
			r.conflict[ci][cj] = r.conflicts(ci, cj)
		}
	}
	switch {
	case r.manual:
	case r.colocate:
		r.names = []string{GlobalPool}
	default:
		r.names = []string{TrainPool, RolloutPool}
		r.pool = [nComp]int{0, 1, 1}
	}
	for p := range r.names {
		r.masks[p] = r.mask(p)
	}
	return r
}

// conflicts: disaggregate keeps train apart from rollout; eval and env
// share a GPU only under device-colocate; manual pools share as the
// user's ranges overlap.
func (r rules) conflicts(ci, cj comp) bool {
	switch {
	case r.manual || ci == cj:
		return false
	case ci == compTrain || cj == compTrain:
		return !r.colocate
	}
	return !r.deviceColocate
}

// mask is the components of auto pool p, one bit each.
func (r rules) mask(p int) uint8 {
	var m uint8
	for ci := range comp(nComp) {
		if r.pool[ci] == p {
			m |= ci.bit()
		}
	}
	return m
}

// apart is the components that live in other auto pools than those of
// mask: where they are, mask's pool must give way to share the node.
func (r rules) apart(mask uint8) uint8 {
	var out uint8
	for ci := range comp(nComp) {
		if mask&ci.bit() == 0 {
			continue
		}
		for cj := range comp(nComp) {
			if r.pool[cj] != r.pool[ci] {
				out |= 1 << cj
			}
		}
	}
	return out
}

// Pool names of auto mode, as in rlightning.
const (
	TrainPool   = "train_pool"
	RolloutPool = "rollout_pool"
	GlobalPool  = "global_pool"
)

// engine is one planning run: fresh (every worker placed) or incremental
// (a previous plan's workers kept where they still fit, the rest placed).
// Both go through the same feasibility chain (feasible.go), the same
// packer (fill), the same record (record) and the same record of why
// (why.go).
type engine struct {
	token *runToken
	spec  *Spec
	rules rules
	opt   Options
	// table is every node of the inventory, by id; runs refer to nodes by
	// their position in it.
	table []*nodeState
	// extras hands out the nodeExtras of the states this run writes.
	extras extraSlab
	// nodes, where loadAll made table, is the slice its states point
	// into, table[i].node == &nodes[i] (nil: a table merged from a
	// previous one, its states pointing into several).
	nodes []Node
	// over, for the length of run, is a view's copies of the nodes
	// given to it, by position (nodeView; nil: none): what merge and
	// loadAll read in place of those nodes.
	over map[int]*Node
	// marks, for the length of run, is a view's marks of the nodes given
	// to it, by position (nodeView; nil: each node's own): what merge and
	// loadAll give the states in place of the nodes' own.
	marks []mark
	// onStates, where set, are the nodes run is given in place of a
	// slice (nil then): these states' nodes, in id order, checked when
	// the states were made (cutFast, on the table of a plan made by an
	// incremental run, which keeps no one slice of its nodes).
	onStates []*nodeState
	demands  [nComp]*demand
	// store holds the workers, nil when only pools are wanted.
	store *workerStore
	base  [nComp]int
	slots int // train, eval and env worker slots; buffers follow
	uuids []string
	// A node's first train worker also reserves its buffer worker's CPUs.
	hasBuffer  bool
	bufferCPUs float64
	// reserve is GPUs still to reserve in the train range for a buffer
	// that uses CUDA, as rlightning does.
	reserve int
	pools   []*poolRun
	// entries finds a manual pool's entry for a node.
	entries map[entryKey]*poolEntry
	// why records why nodes were passed over (why.go).
	why metric
	// trainNodes are nodes given their first train worker in this run.
	trainNodes []int32
	// touched are nodes this run created or copied; rebuffered, those
	// whose buffer worker it rewrote; gone, the ids of the previous plan's
	// nodes that left.
	touched    []int32
	rebuffered []int32
	gone       []string
	cap        plan.Capacity
	attempted  bool // placing began: the arithmetic passed
	invalid    bool // the run failed: its plan places nothing
	warnings   []string
	displaced  []Displaced
	// degrade: a run that cannot place every worker still makes a plan
	// of those it placed, a degraded plan (degrade.go); capErr is then
	// the capacity arithmetic's failure, which does not stop it; unseated
	// are the slots of the displaced workers not placed again yet;
	// keepOnly places none of them, only keeps. takenBy names the plans
	// holding GPUs of previous workers that could not stay (WhyPreempted).
	degrade  bool
	keepOnly bool
	capErr   error
	unseated map[int]Displaced
	takenBy  []string
	// skippedNodes counts the manual pools' nodes a degraded run leaves
	// out (gone, or changed); skippedCounts, the worker_counts they had.
	skippedNodes  int
	skippedCounts [nComp][]int
	// exported are the pools as this run's document exports them, kept
	// with its state for the next run (exportPools).
	exported []exportedPool
	// prev is the previous plan of an incremental run; fast is set when
	// the run started from its state (adoptFast), prevBuffers is the node
	// of each of its buffers (-1: gone), and room the nodes with room
	// once its workers were kept.
	prev        *Plan
	prevState   *runState
	fast        bool
	prevBuffers []int32
	// resized is set when the run starts from the state of a plan made
	// for the spec at other elastic sizes (resize.go), which readAll
	// refuses; prevAsked, prevBase and prevSlots are that plan's layout
	// of worker slots (the spec's own when not resized).
	resized   bool
	readAll   bool
	prevAsked [nComp]int
	prevBase  [nComp]int
	prevSlots int
	// prevBufferIDs is the node of each buffer of a previous plan read
	// back from JSON (adoptSlow).
	prevBufferIDs []string
	room          []int32
	// buffers is the node of each buffer of this run's plan; bufferMoves
	// counts those that changed node.
	buffers     []int32
	bufferMoves int
	// cons are each scheduling group's constraints (nil: none); strict,
	// the NVLink domain each strict group keeps to (strictDomain); memos,
	// what the feasibility chain remembers of each group (groupMemo).
	cons   [nComp][]*Constraints
	strict map[group]string
	memos  map[group]*groupMemo
	// order is the order of units a search tries (spec positions; nil:
	// scarce first); unitOrder, the order this run placed them in;
	// failedUnit, the first of them that fell short (-1: none).
	order      []int
	unitOrder  []int
	failedUnit int
	// seeds are the orders of units a search starts from (units);
	// unitGroups, each unit's group, in the spec's order.
	seeds      [][]int
	unitGroups []group
	// unitMode places a spec without constraints by units too: a search
	// after rlightning's passes fell short; bestFit orders each unit's
	// nodes least room first (rankNodes).
	unitMode bool
	bestFit  bool
	// budget is how many wholly free GPUs the unit being placed may still
	// take on the node it fills (lookahead); negative: no bound.
	budget int
}

// Options tune a planning run.
type Options struct {
	// PoolsOnly plans as usual but records no workers: enough for the
	// rlightning export, and at ten thousand nodes several times cheaper.
	PoolsOnly bool
}

func newEngine(spec *Spec, opt Options) *engine {
	e := &engine{token: new(runToken), spec: spec, rules: newRules(spec.Placement), opt: opt, failedUnit: -1, budget: -1}
	sc := spec.Scheduling
	e.demands[compTrain] = newDemand(compTrain, groupList(sc.Train))
	e.demands[compEval] = newDemand(compEval, groupList(sc.Eval))
	e.demands[compEnv] = newDemand(compEnv, sc.Env)
	for _, d := range e.demands {
		ci := d.ci
		e.base[ci] = e.slots
		e.slots += d.asked
		for _, g := range d.groups {
			e.cons[ci] = append(e.cons[ci], g.Constraints)
		}
	}
	if sc.Buffer != nil && e.demands[compTrain].asked > 0 {
		e.hasBuffer = true
		e.bufferCPUs = sc.Buffer.NumCPUs
		if !e.rules.manual {
			e.reserve = bufferReserve(sc.Buffer)
		}
	}
	if e.rules.manual {
		e.pools = nil // loaded from the spec
	} else {
		for p, name := range e.rules.names {
			e.pools = append(e.pools, &poolRun{name: name, auto: p})
		}
	}
	return e
}

func groupList(g *WorkerGroup) []WorkerGroup {
	if g == nil {
		return nil
	}
	return []WorkerGroup{*g}
}

// bufferReserve is the GPUs rlightning adds to the train range for the
// configured buffer workers (worker_num x num_gpus); "auto" counts as one.
func bufferReserve(bf *WorkerGroup) int {
	n := bf.WorkerNum
	if bf.Auto {
		n = 1
	}
	return int(math.Ceil(float64(n)*bf.NumGPUs - eps))
}

// MaxNodeGPUs bounds a node's GPU count: the planner keeps a share per
// GPU and component.
const MaxNodeGPUs = 1 << 12

// sortedNodes is the order of the nodes run is given: of onStates, in
// id order already, their own.
func (e *engine) sortedNodes(nodes []Node) ([]int, error) {
	if e.onStates == nil {
		return sortedNodes(nodes)
	}
	order := make([]int, len(e.onStates))
	for i := range order {
		order[i] = i
	}
	return order, nil
}

// sortedNodes orders nodes by id, refusing an id given twice and counts
// no machine has.
func sortedNodes(nodes []Node) ([]int, error) {
	for i := range nodes {
		n := &nodes[i]
		if n.GPUs < 0 || n.GPUs > MaxNodeGPUs {
			return nil, &PlanError{Msg: fmt.Sprintf("node %q: %d GPUs is not allowed; want 0 to %d", n.ID, n.GPUs, MaxNodeGPUs)}
		}
		if !(n.CPUs >= 0) || n.CPUs > MaxCPUs {
			return nil, &PlanError{Msg: fmt.Sprintf("node %q: %v CPUs is not allowed; want a number from 0 to %d", n.ID, n.CPUs, int(MaxCPUs))}
		}
	}
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	sorted := true
	for i := 1; i < len(nodes) && sorted; i++ {
		sorted = nodes[i-1].ID < nodes[i].ID
	}
	if !sorted {
		slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(nodes[a].ID, nodes[b].ID) })
	}
	for i := 1; i < len(order); i++ {
		if nodes[order[i-1]].ID == nodes[order[i]].ID {
			return nil, &PlanError{Msg: fmt.Sprintf("node %q appears twice in the inventory", nodes[order[i]].ID)}
		}
	}
	return order, nil
}

// loadAll gives every node a new state, in id order.
func (e *engine) loadAll(nodes []Node, order []int) {
	// A run's states point at their nodes for as long as its plan is
	// kept. The caller's slice, in id order, is kept as it is: the caller
	// does not write it after planning (Node), and a copy was 5.6 MB at
	// 20,000 nodes for a plan of 8 workers. Only a view's copies over it,
	// a previous plan's states, or nodes out of order make a slice of the
	// run's own.
	own := nodes
	if e.over != nil || e.onStates != nil || !inOrder(order) {
		own = make([]Node, len(order))
		for i, j := range order {
			own[i] = *e.nodeAt(nodes, j)
		}
	}
	// A view's marks, in id order, are the states' own (a view's marks
	// are never written once made); a previous plan's states', or marks
	// out of order, a list of the run's own.
	marks := e.marks
	if e.onStates != nil && slices.ContainsFunc(e.onStates, func(ns *nodeState) bool { return ns.held != nil }) ||
		marks != nil && !inOrder(order) {
		marks = make([]mark, len(order))
		for i, j := range order {
			marks[i] = e.markAt(nodes, j)
		}
	}
	e.table = newStates(own, marks, e.token, e.groups(), &e.extras)
	e.nodes = own
	if marks != nil {
		// The states' marks are not their nodes' own: a later run on
		// these nodes (cutFast) starts from the states instead.
		e.nodes = nil
	}
}

// markAt is the mark of node j of the nodes run was given, as its view
// has it (marks, onStates, over).
func (e *engine) markAt(nodes []Node, j int) mark {
	switch {
	case e.onStates != nil:
		return e.onStates[j].mark()
	case e.marks != nil:
		return e.marks[j]
	}
	return markOf(e.nodeAt(nodes, j))
}

// nodeAt is node j of the nodes run was given, as its view has it
// (over).
func (e *engine) nodeAt(nodes []Node, j int) *Node {
	if e.onStates != nil {
		return e.onStates[j].node
	}
	if e.over != nil {
		if n := e.over[j]; n != nil {
			return n
		}
	}
	return &nodes[j]
}

// inOrder reports whether order is 0, 1, 2, ...
func inOrder(order []int) bool {
	for i, j := range order {
		if i != j {
			return false
		}
	}
	return true
}

// groups is the number of scheduling groups of each component.
func (e *engine) groups() [nComp]int {
	var out [nComp]int
	for _, d := range e.demands {
		ci := d.ci
		out[ci] = len(d.groups)
	}
	return out
}

// mut returns the node at position at for writing, copying it first when
// a previous plan owns it.
func (e *engine) mut(at int32) *nodeState {
	ns := e.table[at]
	if ns.owner != e.token {
		ns = ns.clone(e.token)
		e.table[at] = ns
		e.touched = append(e.touched, at)
	}
	return ns
}

// find is the position of node id, or -1.
func (e *engine) find(id string) int32 {
	i, ok := slices.BinarySearchFunc(e.table, id, func(ns *nodeState, id string) int { return strings.Compare(ns.node.ID, id) })
	if !ok {
		return -1
	}
	return int32(i)
}

// roomFor reports whether a component of mask (bit ci) could still take
// a share of some GPU of ns: a GPU no one holds, one it holds part of, or
// (colocate, device-colocate) one held by a component it may share with.
func (e *engine) roomFor(ns *nodeState, mask uint8) bool {
	if ns.free > 0 {
		return true
	}
	for ci := range comp(nComp) {
		if mask&ci.bit() == 0 {
			continue
		}
		for _, g := range ns.usable {
			if e.fits(ns, ci, g, sliver) {
				return true
			}
		}
	}
	return false
}

// sliver is the least share of a GPU that counts as room: fits(eps) would
// find room on a full GPU, as it allows for float error.
const sliver = 10 * eps

const allComps = 1<<nComp - 1

// target is where a placement goes: an auto pool, or a manual pool's entry
// for one node.
type target struct {
	pool  *poolRun
	entry *poolEntry
}

// stopReason says why fill stopped.
type stopReason int

const (
	stopDone stopReason = iota
	stopGPUs
	stopCPUs
	stopTooSmall
)

// fill places the next workers of d on node at, for tg, onto the GPUs of
// gpus (the node's usable GPUs, or a manual pool's there) that fits
// allows, in order: a GPU takes fractional workers while they fit (next
// fit, as rlightning packs), a worker needing k > 1 GPUs takes k GPUs the
// component may use whole, a worker without GPUs needs only CPUs. It
// returns how many it placed and why it stopped; a node that took
// nothing, or ran out of CPUs, is noted with the reason.
func (e *engine) fill(tg target, at int32, d *demand, gpus []int) (int, stopReason) {
	if d.done() {
		return 0, stopDone
	}
	if e.barred(at, d, gpus) {
		return 0, stopTooSmall
	}
	ns := e.mut(at)
	placed := 0
	var p probe
	for !d.done() {
		if p.ns == nil || d.gi != p.g.i {
			// Each group may use only the GPUs its constraints allow.
			p = newProbe(ns, group{d.ci, d.gi}, gpus)
		}
		held, cpus, r := e.feasible(&p)
		count, frac := gpuCount(d.group())
		switch r.link {
		case chainOK:
		case chainNode, chainModel:
			return placed, stopTooSmall
		case chainCPUs:
			e.filter(ns, d.ci, r.reason)
			return placed, stopCPUs
		case chainTooFew:
			if count == 1 {
				return placed, stopGPUs // none allowed here: no news
			}
			e.passedOver(ns, d, placed, nil, r.reason)
			return placed, stopTooSmall
		default:
			e.passedOver(ns, d, placed, p.gpus, r.reason)
			return placed, stopGPUs
		}
		if !e.spend(ns, held) {
			return placed, stopGPUs
		}
		switch {
		case count == 0:
			e.record(tg, at, ns, seatOf(d, nil, 0, cpus))
			d.advance()
			placed++
		case count == 1:
			placed += e.fillGPU(tg, at, ns, d, held, frac, cpus)
		default:
			if p.compromise {
				e.filter(ns, d.ci, ReasonPreferNVLink)
			}
			e.record(tg, at, ns, seatOf(d, held, 1, cpus))
			d.advance()
			placed++
		}
	}
	return placed, stopDone
}

// spend takes gpus from the budget of wholly free GPUs a unit may still
// take on this node (lookahead), reporting whether it could; without a
// budget (negative) always.
func (e *engine) spend(ns *nodeState, gpus []int) bool {
	if e.budget < 0 {
		return true
	}
	cost := 0
	for _, x := range gpus {
		if ns.wholly(x) {
			cost++
		}
	}
	if cost > e.budget {
		return false
	}
	e.budget -= cost
	return true
}

// barred reports whether d's current group may not use node at at all,
// noting why (filterAt).
func (e *engine) barred(at int32, d *demand, gpus []int) bool {
	p := newProbe(e.table[at], group{d.ci, d.gi}, gpus)
	if r := e.nodeWide(&p, workerGPUs(d.group())); !r.ok() {
		e.filterAt(at, d.ci, r.reason)
		return true
	}
	return false
}

// fillGPU places on one GPU (gpu, a one-element window no one changes)
// the next worker and as many more of its group as fit there and in the
// node's CPUs: a 0.25 env group of 300,000 workers is then 75,000 steps,
// not 300,000. cpus is the first worker's CPUs, its buffer's included.
func (e *engine) fillGPU(tg target, at int32, ns *nodeState, d *demand, gpu []int, frac, cpus float64) int {
	g := d.group()
	n := int((1 + eps - ns.shareOf(d.ci)[gpu[0]]) / frac)
	if cpus > 0 {
		n = min(n, int((ns.cpuLeft+eps)/cpus))
	}
	if cpus != g.NumCPUs {
		n = 1 // the first train worker also reserves its buffer's CPUs
	}
	n = d.run(max(n, 1))
	for range n {
		e.record(tg, at, ns, seatOf(d, gpu, frac, cpus))
		d.advance()
		cpus = g.NumCPUs
	}
	return n
}

// pick chooses count GPUs of gpus, from *pos on, of which component ci
// may take frac each, and moves *pos past them; nil when there are too
// few.
func (e *engine) pick(ns *nodeState, ci comp, gpus []int, pos *int, count int, frac float64) []int {
	start, k := -1, 0
	var held []int
	contiguous := true
	for i := *pos; i < len(gpus) && k < count; i++ {
		if !e.fits(ns, ci, gpus[i], frac) {
			if k > 0 {
				contiguous = false
			}
			continue
		}
		if start < 0 {
			start = i
		}
		held = append(held, gpus[i])
		k++
		*pos = i + 1
	}
	if k < count {
		return nil
	}
	if contiguous {
		// A window of a list no one changes: workers share it.
		return gpus[start : start+count : start+count]
	}
	return held
}

// passedOver notes why a node took none of d's workers. A node that
// filled up after taking some is no news, nor one whose GPUs (of gpus) the
// component could take none of (full, or held by what it may not share
// with): only one that had room, but not enough.
func (e *engine) passedOver(ns *nodeState, d *demand, placed int, gpus []int, reason string) {
	if placed > 0 {
		return
	}
	open := gpus == nil
	for _, g := range gpus {
		open = open || e.fits(ns, d.ci, g, sliver)
	}
	if open {
		e.filter(ns, d.ci, reason)
	}
}

// seat is one worker as record places it: whose it is (component,
// index, scheduling group), the GPUs it holds (a list no one changes
// after: workers share it) and its share of each, the CPUs it costs (a
// node's first train worker: its buffer's too), and, when given, its
// GPUs' UUIDs, already checked.
type seat struct {
	c     comp
	index int
	gi    int
	g     WorkerGroup
	gpus  []int
	uuids []string
	frac  float64
	cpus  float64
}

// seatOf is the next worker of d, holding gpus, frac of each.
func seatOf(d *demand, gpus []int, frac, cpus float64) seat {
	return seat{c: d.ci, index: d.index(), gi: d.gi, g: d.group(), gpus: gpus, frac: frac, cpus: cpus}
}

// record places worker s on node at (state ns) for target tg.
func (e *engine) record(tg target, at int32, ns *nodeState, s seat) {
	ci, index, gi, g, gpus, uuids, frac, cpus := s.c, s.index, s.gi, s.g, s.gpus, s.uuids, s.frac, s.cpus
	joined := tg.pool != nil && tg.entry == nil && !e.member(ns, tg.pool.auto)
	ns.hold(ci, gi, gpus, frac, cpus, &e.extras)
	if tg.entry != nil {
		tg.entry.placed[ci][gi]++
	}
	if ci == compTrain && (ns.firstTrain < 0 || index < int(ns.firstTrain)) {
		if ns.firstTrain < 0 {
			e.trainNodes = append(e.trainNodes, at)
		}
		ns.firstTrain = int32(index)
	}
	if joined {
		tg.pool.join(at)
	}
	if e.store == nil {
		return
	}
	slot := e.base[ci] + index
	if e.unseated != nil {
		delete(e.unseated, slot)
	}
	ns.addSlot(slot, &e.extras)
	name := tg.pool.name
	w := plan.Worker{Component: plan.GPUComponents[ci], Index: index, Pool: name, NodeID: ns.node.ID, IP: ns.node.IP, CPUs: g.NumCPUs}
	if len(gpus) > 0 {
		w.GPUs, w.GPUShare = gpus, frac
		switch {
		case uuids != nil:
			w.GPUUUIDs = uuids
		case ns.node.hasUUIDs():
			if len(e.uuids)+len(gpus) > cap(e.uuids) {
				// A new slab rather than append's growth: the workers
				// recorded keep windows of the old array, so growing
				// would keep every array it grew through alive (35 MB of
				// 7 MB of UUIDs at 400,000 workers).
				e.uuids = make([]string, 0, max(uuidSlab, len(gpus)))
			}
			start := len(e.uuids)
			for _, x := range gpus {
				e.uuids = append(e.uuids, ns.node.GPUUUIDs[x])
			}
			w.GPUUUIDs = e.uuids[start:len(e.uuids):len(e.uuids)]
		}
	}
	e.store.set(slot, w)
}

// uuidSlab is how many GPU UUIDs each of the engine's slabs of workers'
// UUIDs holds.
const uuidSlab = 4096

// member reports whether ns belongs to auto pool p: it hosts one of its
// components' workers, or (train's pool) GPUs reserved for a buffer.
func (e *engine) member(ns *nodeState, p int) bool {
	if ns.hosts(e.rules.masks[p]) {
		return true
	}
	return p == e.rules.pool[compTrain] && slices.Contains(ns.resv(), true)
}

// reserveOn reserves GPUs still owed to a buffer that uses CUDA on the
// node's first wholly free GPUs, in train's pool.
func (e *engine) reserveOn(tp *poolRun, at int32) {
	ns := e.table[at]
	if ns.free == 0 {
		return
	}
	ns = e.mut(at)
	joined := !e.member(ns, tp.auto)
	for _, g := range ns.usable {
		if e.reserve == 0 {
			break
		}
		if ns.wholly(g) {
			ns.reserve(g, &e.extras)
			ns.free--
			e.reserve--
		}
	}
	if joined && e.member(ns, tp.auto) {
		tp.join(at)
	}
}
