package planner

import (
	"reflect"
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// poolRun is one resource pool during a run.
type poolRun struct {
	name string
	// auto is the pool's index among the rules' auto pools, -1 for a
	// manual pool.
	auto int
	// order is, for an auto pool, its nodes in the previous plan's order;
	// joined are the nodes that joined it in this run, in order.
	order  []int32
	joined []int32
	// final is the pool's nodes in the plan document; rendered, their
	// entries there.
	final    []int32
	rendered plan.PoolNodes
	// entries are a manual pool's nodes, as the spec lists them.
	entries []*poolEntry
}

func (p *poolRun) join(at int32) { p.joined = append(p.joined, at) }

// poolEntry is one node of a manual pool and what the spec gives each
// component there.
type poolEntry struct {
	at   int32
	pool int // the pool's position in the run's pools
	// alloc is the node-local GPUs the spec's ranges give each component,
	// in order; gpus the healthy ones.
	alloc [nComp][]int
	gpus  [nComp][]int
	// counts are the pool's worker_counts here, per group (nil: none
	// given); placed counts the workers placed here, per group.
	counts [nComp][]int
	placed [nComp][]int
}

// Tiers order the candidate nodes of a pass, as Nomad's ranking orders
// feasible nodes: where the components already are, so pools stay
// compact and fractions pack; then nodes that keep pools pure; last,
// nodes of another pool, which a pool shares only when it must.
const (
	tierHome uint8 = iota
	tierClean
	tierMixed
)

// cand is a candidate node of a pass and its tier.
type cand struct {
	at   int32
	tier uint8
}

// candidates orders src (positions in rank order) for the components of
// mask: tier by tier, rank order within each. In a fresh plan nothing is
// placed when a pass begins, so every node is clean, bar (for rollout)
// the train nodes: rlightning's order, with pools kept pure.
func (e *engine) candidates(src []int32, mask uint8) []cand {
	apart := e.rules.apart(mask)
	tier := func(ns *nodeState) uint8 {
		switch {
		case ns.hosts(mask):
			return tierHome
		case ns.hosts(apart), apart&1 != 0 && slices.Contains(ns.resv(), true):
			return tierMixed
		}
		return tierClean
	}
	out := make([]cand, 0, len(src))
	for t := tierHome; t <= tierMixed; t++ {
		for _, at := range src {
			if tier(e.table[at]) == t {
				out = append(out, cand{at, t})
			}
		}
	}
	return out
}

// visit says whether a pass should try the node for the components of
// mask: it must have a GPU one of them may still take a share of. (When a
// fresh plan's pass reaches a node, nothing is placed there yet, or only
// what the rollout components may not share: rlightning's "a free GPU".)
// A node passed by is noted when it cannot serve at all (no GPUs, none
// healthy) and counted when it is full.
func (e *engine) visit(c cand, mask uint8) bool {
	ns := e.table[c.at]
	if e.roomFor(ns, mask) {
		return true
	}
	for _, d := range e.demands {
		ci := d.ci
		if mask&ci.bit() == 0 || d.done() {
			continue
		}
		switch {
		case ns.node.GPUs == 0:
			e.filter(e.mut(c.at), ci, ReasonNoGPUs)
		case len(ns.usable) == 0:
			why := heldReason(ns)
			if why == "" {
				why = ReasonNoHealthyGPUs
			}
			e.filter(e.mut(c.at), ci, why)
		default:
			e.exhaust(ci, ReasonNoFreeGPUs, ns.node.ID)
		}
	}
	return false
}

// place runs the placement's passes over src, candidate nodes in rank
// order: every node for a fresh plan, those with room for an incremental
// one. A spec without constraints is placed by rlightning's passes
// (disaggregate, colocate), so that its plan is rlightning's wherever
// rlightning plans sanely; one with constraints, or a search after those
// passes fell short, by units (units.go). In auto mode workers that need
// no GPU wait until every GPU worker is placed: rlightning's passes would
// put them on the first nodes with a free GPU, where their CPUs can leave
// a GPU worker nowhere to go.
func (e *engine) place(src []int32) {
	switch {
	case e.rules.manual:
		e.manualPasses()
	case e.byUnits():
		e.placeUnits(src)
	default:
		deferred := e.deferCPUOnly()
		if e.rules.colocate {
			e.colocate(src)
		} else {
			e.disaggregate(src)
		}
		e.cpuOnly(deferred)
	}
}

// deferCPUOnly takes the workers of groups that need no GPU out of the
// demands, and returns them by component.
func (e *engine) deferCPUOnly() [nComp][]int {
	var out [nComp][]int
	for _, d := range e.demands {
		ci := d.ci
		some := false
		for _, g := range d.groups {
			some = some || g.WorkerNum > 0 && g.NumGPUs <= 0
		}
		if !some {
			continue
		}
		gpu := []int{}
		for ; !d.done(); d.advance() {
			if d.group().NumGPUs > 0 {
				gpu = append(gpu, d.index())
			} else {
				out[ci] = append(out[ci], d.index())
			}
		}
		d.only(gpu)
	}
	return out
}

// cpuOnly places the workers that need no GPU on any node with the CPUs,
// in tier and rank order (their component's nodes first); what it cannot
// place goes back to the demand, for the shortfall to say.
func (e *engine) cpuOnly(deferred [nComp][]int) {
	var all []int32
	for i, list := range deferred {
		ci := comp(i)
		if len(list) == 0 {
			continue
		}
		if all == nil {
			all = make([]int32, len(e.table))
			for i := range all {
				all[i] = int32(i)
			}
			all = rankOrder(e.table, all)
		}
		d := e.demands[ci]
		var left []int
		// Groups with constraints of their own each get the nodes again:
		// a node one group may not use stops the pass there for it alone.
		for _, list := range e.byGroup(ci, list) {
			cd := *d
			cd.only(list)
			tg := target{pool: e.pools[e.rules.pool[ci]]}
			for _, c := range e.candidates(all, ci.bit()) {
				if cd.done() {
					break
				}
				if e.table[c.at].cpuLeft+eps < cd.group().NumCPUs {
					e.exhaust(ci, ReasonCPUsExhausted, e.table[c.at].node.ID)
					continue
				}
				placed, _ := e.fill(tg, c.at, &cd, nil)
				e.shared(c, &cd, placed)
			}
			for ; !cd.done(); cd.advance() {
				left = append(left, cd.index())
			}
		}
		for ; !d.done(); d.advance() {
			left = append(left, d.index())
		}
		slices.Sort(left)
		d.only(left)
	}
}

// byGroup splits list (indices of component ci) by scheduling group
// where the groups' constraints differ; else it is list alone.
func (e *engine) byGroup(ci comp, list []int) [][]int {
	if !e.groupsDiffer(ci) {
		return [][]int{list}
	}
	d := e.demands[ci]
	out := make([][]int, len(d.groups))
	for _, i := range list {
		gi, _ := d.groupAt(i)
		out[gi] = append(out[gi], i)
	}
	return out
}

// groupsDiffer reports whether component ci's groups have constraints
// that differ.
func (e *engine) groupsDiffer(ci comp) bool {
	cs := e.cons[ci]
	for _, c := range cs[min(1, len(cs)):] {
		if !reflect.DeepEqual(c, cs[0]) {
			return true
		}
	}
	return false
}

// disaggregate gives train its own nodes and rollout (eval and env) the
// rest. rlightning's second pass walks the nodes in order and so puts
// rollout workers on a train node's leftover GPUs inside train_pool; here
// rollout takes the nodes train does not use first, and a train node's
// leftover only when it must, as a member of both pools.
func (e *engine) disaggregate(src []int32) {
	train := e.demands[compTrain]
	tp, rp := e.pools[0], e.pools[1]
	for _, c := range e.candidates(src, e.rules.masks[0]) {
		if train.done() && e.reserve == 0 {
			break
		}
		if e.visit(c, e.rules.masks[0]) {
			e.fillTrain(tp, c)
		}
	}
	// Eval and env share the rollout pass, each node taking eval first.
	e.rollout(rp, src)
}

// rollout is the pass of the rollout pool over order: on each node eval,
// then env.
func (e *engine) rollout(rp *poolRun, order []int32) {
	eval, env := e.demands[compEval], e.demands[compEnv]
	for _, c := range e.candidates(order, e.rules.masks[1]) {
		if eval.done() && env.done() {
			break
		}
		if !e.visit(c, e.rules.masks[1]) {
			continue
		}
		usable := e.table[c.at].usable
		pe, _ := e.fill(target{pool: rp}, c.at, eval, usable)
		e.shared(c, eval, pe)
		pv, _ := e.fill(target{pool: rp}, c.at, env, usable)
		e.shared(c, env, pv)
	}
}

// colocate puts every component in one global_pool: train overlaps the
// rollout GPUs of a node; eval and env share GPUs under device-colocate
// and follow one another otherwise. rlightning sizes env by the GPUs the
// node had before eval took its share, and so can ask for GPUs the node no
// longer has; here env takes only what eval left.
func (e *engine) colocate(src []int32) {
	train, eval, env := e.demands[compTrain], e.demands[compEval], e.demands[compEnv]
	gp := e.pools[0]
	for _, c := range e.candidates(src, e.rules.masks[0]) {
		if train.done() && eval.done() && env.done() && e.reserve == 0 {
			break
		}
		if !e.visit(c, e.rules.masks[0]) {
			continue
		}
		e.fillTrain(gp, c)
		usable := e.table[c.at].usable
		e.fill(target{pool: gp}, c.at, eval, usable)
		e.fill(target{pool: gp}, c.at, env, usable)
	}
}

// fillTrain places train workers on the candidate, then reserves what is
// still owed to a buffer that uses CUDA once train is done.
func (e *engine) fillTrain(tp *poolRun, c cand) {
	train := e.demands[compTrain]
	placed, _ := e.fill(target{pool: tp}, c.at, train, e.table[c.at].usable)
	if train.done() && e.reserve > 0 {
		e.reserveOn(tp, c.at)
	}
	e.shared(c, train, placed)
}

// shared notes that placed workers of d went to a node of another pool:
// pool purity gave way because the nodes that keep it had no room.
func (e *engine) shared(c cand, d *demand, placed int) {
	if placed > 0 && c.tier == tierMixed {
		e.filter(e.mut(c.at), d.ci, ReasonPoolShared)
	}
}
