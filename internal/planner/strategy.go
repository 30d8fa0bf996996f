package planner

import (
	"reflect"
	"slices"
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
	// final is the pool's nodes in the plan document.
	final []int32
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
		case ns.hosts(apart), apart&1 != 0 && ns.resv != nil && slices.Contains(ns.resv, true):
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
	for ci, d := range e.demands {
		if mask&(1<<ci) == 0 || d.done() {
			continue
		}
		switch {
		case ns.node.GPUs == 0:
			e.mut(c.at).note(d.comp, ReasonNoGPUs)
		case len(ns.usable) == 0:
			e.mut(c.at).note(d.comp, ReasonNoHealthyGPUs)
		default:
			e.passedBy(ci, ReasonNoFreeGPUs, ns.node.ID)
		}
	}
	return false
}

// passedBy counts a node passed by for component ci without a note of its
// own: a full node is no news in itself, only in sum.
func (e *engine) passedBy(ci int, reason, node string) {
	if e.passed[ci] == nil {
		e.passed[ci] = map[string]*tally{}
	}
	t := e.passed[ci][reason]
	if t == nil {
		t = &tally{}
		e.passed[ci][reason] = t
	}
	t.add(node)
}

// place runs the placement's passes over src, candidate nodes in rank
// order: every node for a fresh plan, those with room for an incremental
// one. In auto mode workers that need no GPU wait until every GPU worker
// is placed: rlightning's passes would put them on the first nodes with a
// free GPU, where their CPUs can leave a GPU worker nowhere to go.
func (e *engine) place(src []int32) {
	if e.rules.manual {
		e.manualPasses()
		return
	}
	deferred := e.deferCPUOnly()
	if e.rules.colocate {
		e.colocate(src)
	} else {
		e.disaggregate(src)
	}
	e.groupPasses(src)
	e.cpuOnly(deferred)
}

// deferCPUOnly takes the workers of groups that need no GPU out of the
// demands, and returns them by component.
func (e *engine) deferCPUOnly() [nComp][]int {
	var out [nComp][]int
	for ci, d := range e.demands {
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
	for ci, list := range deferred {
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
			for _, c := range e.candidates(all, 1<<ci) {
				if cd.done() {
					break
				}
				if e.table[c.at].cpuLeft+eps < cd.group().NumCPUs {
					e.passedBy(ci, ReasonCPUsExhausted, e.table[c.at].node.ID)
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
func (e *engine) byGroup(ci int, list []int) [][]int {
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
func (e *engine) groupsDiffer(ci int) bool {
	cs := e.cons[ci]
	for _, c := range cs[min(1, len(cs)):] {
		if !reflect.DeepEqual(c, cs[0]) {
			return true
		}
	}
	return false
}

// groupPasses places, group by group, each over the nodes in its own
// order (its nvlink_domain's), the workers of a component whose groups
// have constraints of their own: a pass that placed the groups in turn
// would stop at a node one group may not use for the groups after it
// too. The strategy's passes leave env to it then; train and eval, one
// group each, never.
func (e *engine) groupPasses(src []int32) {
	for ci, d := range e.demands {
		if d.done() || !e.groupsDiffer(ci) {
			continue
		}
		var list, left []int
		for ; !d.done(); d.advance() {
			list = append(list, d.index())
		}
		tg := target{pool: e.pools[e.rules.pool[ci]]}
		for gi, idx := range e.byGroup(ci, list) {
			if len(idx) == 0 {
				continue
			}
			cd := *d
			cd.only(idx)
			for _, c := range e.candidates(e.domainOrderGroup(src, ci, gi, true), 1<<ci) {
				if cd.done() {
					break
				}
				if e.roomFor(e.table[c.at], 1<<ci) {
					placed, _ := e.fill(tg, c.at, &cd, e.table[c.at].usable)
					e.shared(c, &cd, placed)
				}
			}
			for ; !cd.done(); cd.advance() {
				left = append(left, cd.index())
			}
		}
		slices.Sort(left)
		d.only(left)
	}
}

// disaggregate gives train its own nodes and rollout (eval and env) the
// rest. rlightning's second pass walks the nodes in order and so puts
// rollout workers on a train node's leftover GPUs inside train_pool; here
// rollout takes the nodes train does not use first, and a train node's
// leftover only when it must, as a member of both pools.
func (e *engine) disaggregate(src []int32) {
	train := e.demands[0]
	tp, rp := e.pools[0], e.pools[1]
	for _, c := range e.candidates(e.domainOrder(src, 0), e.rules.masks[0]) {
		if train.done() && e.reserve == 0 {
			break
		}
		if e.visit(c, e.rules.masks[0]) {
			e.fillTrain(tp, c)
		}
	}
	// Eval and env share the rollout pass, each node taking eval first;
	// where both have an nvlink_domain, or one keeps strictly to a domain
	// the other need not share, each gets a pass of its own. Env groups
	// with constraints of their own get theirs later (groupPasses).
	if e.groupsDiffer(2) {
		e.rollout(rp, e.domainOrder(src, 1), true, false)
		return
	}
	me, _ := e.domainMode(1)
	mv, _ := e.domainMode(2)
	if me != "" && mv != "" || me == DomainStrict && e.demands[2].left() > 0 || mv == DomainStrict && e.demands[1].left() > 0 {
		e.rollout(rp, e.domainOrder(src, 1), true, false)
		e.rollout(rp, e.domainOrder(src, 2), false, true)
		return
	}
	e.rollout(rp, e.domainSrc(src, 1, 2), true, true)
}

// rollout is a pass of the rollout pool over order, placing eval, env or
// both.
func (e *engine) rollout(rp *poolRun, order []int32, evalOn, envOn bool) {
	eval, env := e.demands[1], e.demands[2]
	for _, c := range e.candidates(order, e.rules.masks[1]) {
		if (eval.done() || !evalOn) && (env.done() || !envOn) {
			break
		}
		if !e.visit(c, e.rules.masks[1]) {
			continue
		}
		usable := e.table[c.at].usable
		if evalOn {
			pe, _ := e.fill(target{pool: rp}, c.at, eval, usable)
			e.shared(c, eval, pe)
		}
		if envOn {
			pv, _ := e.fill(target{pool: rp}, c.at, env, usable)
			e.shared(c, env, pv)
		}
	}
}

// colocate puts every component in one global_pool: train overlaps the
// rollout GPUs of a node; eval and env share GPUs under device-colocate
// and follow one another otherwise. rlightning sizes env by the GPUs the
// node had before eval took its share, and so can ask for GPUs the node no
// longer has; here env takes only what eval left.
func (e *engine) colocate(src []int32) {
	train, eval, env := e.demands[0], e.demands[1], e.demands[2]
	gp := e.pools[0]
	for _, c := range e.candidates(e.domainSrc(src, 0, 1, 2), e.rules.masks[0]) {
		if train.done() && eval.done() && env.done() && e.reserve == 0 {
			break
		}
		if !e.visit(c, e.rules.masks[0]) {
			continue
		}
		e.fillTrain(gp, c)
		usable := e.table[c.at].usable
		e.fill(target{pool: gp}, c.at, eval, usable)
		if !e.groupsDiffer(2) {
			e.fill(target{pool: gp}, c.at, env, usable) // else groupPasses
		}
	}
}

// fillTrain places train workers on the candidate, then reserves what is
// still owed to a buffer that uses CUDA once train is done.
func (e *engine) fillTrain(tp *poolRun, c cand) {
	train := e.demands[0]
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
		e.mut(c.at).note(d.comp, ReasonPoolShared)
	}
}
