package planner

import (
	"cmp"
	"fmt"
	"slices"
)

// With constraints, the strategy's shared passes (rlightning's order:
// train, then eval and env node by node) give way to one pass per
// scheduling group, a unit, scarcest first: a group that may use only a
// few GPUs is placed before one that may go anywhere, which then takes
// what is left. Each pass also steers clear of the nodes the units after
// it need (rankNodes), and takes no more of a node than leaves them room
// (lookahead). Where that falls short, other orders are tried (search)
// before the spec is declared infeasible, and the error names what binds
// (binding.go). Without constraints the passes, their order and their
// packing are rlightning's, unchanged (strategy.go); only where those
// fall short does a search by units follow.

// unit is what a pass of its own places: one scheduling group. (A pass
// over nodes in turn gives up on a node once a worker does not fit
// there: groups of other sizes or constraints would be turned away from
// room they could use. A group's pass still fills the GPUs an earlier
// group of its component left part of: its nodes come first.)
type unit struct {
	c comp
	g int // the group's position among the component's groups
	// gpus is how many GPUs its workers to place fill; room, how many
	// usable GPUs its constraints allow on nodes that could hold one of
	// its workers (its scarcity); weight, gpus/room: how hard it presses
	// on each node it may use.
	gpus, room int
	weight     float64
	// needy: its constraints narrow where it may go (node_selector,
	// gpu_model, min_gpu_memory_gb, gpu_link nvlink or numa); others
	// steer clear of the nodes it needs.
	needy bool
	// may is, per node (table position), whether the node could hold one
	// of its workers were it empty (measure, or mayUse on first ask).
	may []bool
	// pos is its place among the run's units in the spec's order;
	// workers, how many workers it has to place.
	pos, workers int
}

func (u *unit) lead() group { return group{u.c, u.g} }

// units are the units with workers still to place (a CPU-only group is
// not one: cpuOnly places it last), in the order this run tries: the
// engine's order when a search set one, else the scarcest first (fewest
// GPUs its constraints allow; the spec's order among equals).
func (e *engine) units(pending [nComp][]indices) []*unit {
	var out []*unit
	for _, d := range e.demands {
		c := d.ci
		var gs []int
		for gi, idx := range pending[c] {
			if idx.len() > 0 {
				gs = append(gs, gi)
			}
		}
		if c == compTrain && len(gs) == 0 && e.reserve > 0 && len(d.groups) > 0 {
			gs = []int{0} // only a buffer's GPUs to reserve
		}
		for _, gi := range gs {
			out = append(out, &unit{c: c, g: gi})
		}
	}
	e.unitGroups = e.unitGroups[:0]
	for i, u := range out {
		e.unitGroups = append(e.unitGroups, u.lead())
		u.pos, u.workers = i, pending[u.c][u.g].len()
		if len(out) > 1 {
			e.measure(u)
		}
	}
	// The orders a search starts from: scarcest first (larger workers
	// first among equals), then larger workers first (first fit
	// decreasing: small workers fill the gaps large ones leave).
	size := func(u *unit) float64 { return -e.groupSpec(u.lead()).NumGPUs }
	e.seeds = [][]int{
		orderBy(out, func(u *unit) float64 { return float64(u.room) }, size),
		orderBy(out, size, func(u *unit) float64 { return float64(u.room) }),
	}
	order := e.order
	if len(order) != len(out) {
		order = e.seeds[0]
	}
	e.unitOrder = order
	sorted := make([]*unit, len(out))
	for k, i := range order {
		sorted[k] = out[i]
	}
	return sorted
}

// orderBy is the units' positions, sorted by the keys in turn (stable:
// the spec's order among equals).
func orderBy(units []*unit, keys ...func(*unit) float64) []int {
	sorted := slices.Clone(units)
	slices.SortStableFunc(sorted, func(a, b *unit) int {
		for _, k := range keys {
			if c := cmp.Compare(k(a), k(b)); c != 0 {
				return c
			}
		}
		return 0
	})
	out := make([]int, len(sorted))
	for i, u := range sorted {
		out[i] = u.pos
	}
	return out
}

// measure sets u's GPUs, room, weight, neediness and the nodes it may
// use: a walk over every node, for a run of several units.
func (e *engine) measure(u *unit) {
	w := e.demands[u.c].groups[u.g]
	w.WorkerNum = u.workers
	u.gpus = gpusNeeded([]WorkerGroup{w})
	g := u.lead()
	c := e.con(g)
	u.needy = c.any() && (len(c.NodeSelector) > 0 || c.gpuWise() || c.GPULink == LinkNVLink || c.GPULink == LinkNUMA)
	count := workerGPUs(e.groupSpec(g))
	u.may = make([]bool, len(e.table))
	for at, ns := range e.table {
		if e.emptyRoom(ns, g, layerLink) == 0 {
			continue
		}
		u.may[at] = true
		gpus, _ := e.allowedGPUs(ns, g, ns.usable, count)
		u.room += len(gpus)
	}
	u.weight = float64(u.gpus) / float64(max(u.room, 1))
}

// maxAttempts bounds the orders a search tries; searchBudget bounds them
// by the cluster's size too: attempts times nodes.
const (
	maxAttempts  = 24
	searchBudget = 1 << 17
)

// attempts is how many runs a search over n nodes of k units may make:
// two for each order of the units there is.
func attempts(k, nodes int) int {
	perms := 1
	for i := 2; i <= k && perms < maxAttempts; i++ {
		perms *= i
	}
	return min(2*perms, maxAttempts, max(3, searchBudget/max(nodes, 1)))
}

// search tries other orders of the units of a run that could not place
// every worker, and returns the first run that could, nil if none did
// within attempts. Each order is tried twice: nodes in rank order, then
// best fit (rankNodes). The orders: the seeds (units), then the last order
// with the unit that fell short first moved to the front (what it needs,
// the units before it took); an order tried before gives way to the next
// untried one in lexicographic order. A run without constraints
// (rlightning's passes) starts from the seeds too.
func (e *engine) search(nodes []Node) *engine {
	tried := map[string]bool{}
	var seeds [][]int
	var perm []int
	offered := false // perm was offered already
	// next is the order to try after order, whose first unit to fall
	// short was failed; nil when there is none left.
	next := func(order []int, failed int) []int {
		for len(seeds) > 0 {
			o := seeds[0]
			seeds = seeds[1:]
			if !tried[fmt.Sprint(o)] {
				return o
			}
		}
		o := promote(order, failed)
		if perm == nil {
			perm = make([]int, len(order))
			for i := range perm {
				perm[i] = i
			}
		}
		for tried[fmt.Sprint(o)] {
			if offered && !nextPerm(perm) {
				return nil
			}
			offered = true
			o = slices.Clone(perm)
		}
		return o
	}
	limit := 3
	order, bestFit := []int(nil), false // nil: the first seed
	if e.byUnits() {
		if len(e.unitOrder) < 2 {
			return nil
		}
		seeds, limit = e.seeds, attempts(len(e.unitOrder), len(nodes))
		order, bestFit = e.unitOrder, true // tried in rank order already
	}
	for a := 1; a < limit && (order != nil || a == 1); a++ {
		try := newEngine(e.spec, e.opt)
		try.unitMode, try.order, try.bestFit = true, order, bestFit
		if try.run(nodes) == nil {
			return try
		}
		if order == nil {
			if len(try.unitOrder) < 2 {
				return nil
			}
			seeds, limit = try.seeds, attempts(len(try.unitOrder), len(nodes))
		}
		order = try.unitOrder
		tried[fmt.Sprint(order)] = true
		if !bestFit {
			bestFit = true
			continue
		}
		order, bestFit = next(order, try.failedUnit), false
	}
	return nil
}

// promote is order with unit u moved to the front (order itself when u
// is none, -1).
func promote(order []int, u int) []int {
	if u < 0 {
		return order
	}
	return append([]int{u}, slices.DeleteFunc(slices.Clone(order), func(x int) bool { return x == u })...)
}

// nextPerm steps p to the next permutation in lexicographic order; false
// after the last.
func nextPerm(p []int) bool {
	i := len(p) - 2
	for i >= 0 && p[i] >= p[i+1] {
		i--
	}
	if i < 0 {
		return false
	}
	j := len(p) - 1
	for p[j] <= p[i] {
		j--
	}
	p[i], p[j] = p[j], p[i]
	slices.Reverse(p[i+1:])
	return true
}

// placeUnits places the workers of a constrained spec, unit by unit, each
// over the nodes in its own order: its nvlink_domain's, the nodes later
// units need last. Workers that need no GPU wait for every GPU worker, as
// in place.
func (e *engine) placeUnits(src []int32) {
	deferred := e.deferCPUOnly()
	var pending [nComp][]indices
	for _, d := range e.demands {
		pending[d.ci] = d.byGroup()
	}
	us := e.units(pending)
	var left [nComp][]int
	for k, u := range us {
		d := *e.demands[u.c]
		pending[u.c][u.g].limit(&d)
		pending[u.c][u.g] = indices{}
		e.placeUnit(src, u, &d, us[k+1:])
		if !d.done() && e.failedUnit < 0 {
			e.failedUnit = u.pos
		}
		for ; !d.done(); d.advance() {
			left[u.c] = append(left[u.c], d.index())
		}
	}
	for _, d := range e.demands {
		slices.Sort(left[d.ci])
		d.only(left[d.ci])
	}
	e.cpuOnly(deferred)
}

// placeUnit is u's pass over its blocks of nodes (nodeBlocks), each
// visited whole before the next: within a block its candidates in tier
// order (its pool's nodes first, nodes of another pool last), the nodes
// later units need last.
func (e *engine) placeUnit(src []int32, u *unit, d *demand, later []*unit) {
	g := u.lead()
	p := e.rules.pool[u.c]
	tg := target{pool: e.pools[p]}
	if e.strictGroup(g) {
		e.chooseStrict(u, later)
	}
	la := e.lookahead(u, later, src)
	blocks := e.nodeBlocks(src, u, later)
pass:
	for _, block := range blocks {
		for _, c := range e.candidates(block, e.rules.masks[p]) {
			if d.done() && (u.c != compTrain || e.reserve == 0) {
				break pass
			}
			if !e.visit(c, u.c.bit()) {
				continue
			}
			e.budget = la.slack(c.at)
			if e.budget == 0 {
				continue
			}
			placed, _ := e.fill(tg, c.at, d, e.table[c.at].usable)
			e.budget = -1
			la.update(e, c.at)
			if u.c == compTrain && d.done() && e.reserve > 0 {
				e.reserveOn(tg.pool, c.at)
			}
			e.shared(c, d, placed)
		}
	}
}

// nodeBlocks is the order u's pass visits src in, as blocks: under
// nvlink_domain pack one block per NVLink domain (packBlocks), so that
// tiers and costs reorder nodes only inside a domain and each domain
// takes one run of ranks; else one block, in the nvlink_domain's order
// (strict: its one domain), the nodes later units need last (rankNodes).
func (e *engine) nodeBlocks(src []int32, u *unit, later []*unit) [][]int32 {
	if c := e.con(u.lead()); c != nil && c.NVLinkDomain == DomainPack {
		return e.packBlocks(src, u, later)
	}
	order := e.domainOrder(src, u.c, u.g)
	if r := e.rankNodes(order, u, later); r != nil {
		order = slices.Clone(order)
		r.sort(order)
	}
	return [][]int32{order}
}

// packDomain is one NVLink domain (or a node of none) as packBlocks
// weighs it: its nodes among the pass's, the workers of the unit they
// could take now, those it holds there already (a replan), where its
// first node comes in rank order, and how much later units need it.
type packDomain struct {
	nodes      []int32
	room, kept int
	first      int
	cost       float64
	loner      bool
	chosen     bool
}

// packBlocks orders src for a pack unit: the fewest NVLink domains that
// hold its workers, whole domains largest first and the remainder in the
// domain with the least room that still holds it (so that a big domain
// is not broken into for a few ranks), each domain one block, so that
// consecutive ranks share a domain. Domains that hold its workers
// already (a replan) come first. Nodes of no domain take part only when
// the domains cannot hold the unit, each then a domain of its own; the
// domains not chosen follow, largest first, in case the room counted now
// falls short (a lookahead holding GPUs back for later units), then the
// nodes of no domain. Among domains of equal room, those later units
// need least come first, then real domains, then rank order.
func (e *engine) packBlocks(src []int32, u *unit, later []*unit) [][]int32 {
	r := e.rankNodes(src, u, later)
	g := u.lead()
	byID := map[string]*packDomain{}
	var doms, loners []*packDomain
	for pos, at := range src {
		ns := e.table[at]
		var d *packDomain
		if ns.node.Domain == "" {
			d = &packDomain{first: pos, loner: true}
			loners = append(loners, d)
		} else if d = byID[ns.node.Domain]; d == nil {
			d = &packDomain{first: pos}
			byID[ns.node.Domain] = d
			doms = append(doms, d)
		}
		d.nodes = append(d.nodes, at)
		d.room += e.roomOf(ns, u.c, u.g)
	}
	if e.prev != nil || e.prevState != nil {
		// Kept workers may sit on nodes with no room left: count them over
		// the whole table.
		for _, ns := range e.table {
			if g.i < len(ns.gcountOf(g.c)) && ns.gcountOf(g.c)[g.i] > 0 {
				if d := byID[ns.node.Domain]; d != nil && ns.node.Domain != "" {
					d.kept += int(ns.gcountOf(g.c)[g.i])
				}
			}
		}
	}
	for _, d := range slices.Concat(doms, loners) {
		if r != nil {
			r.sort(d.nodes)
			d.cost = r.meanCost(d.nodes)
		}
	}
	// Nodes of no domain only when the domains cannot hold the unit; then
	// they count as domains of their own, after real ones of equal room.
	need, total := u.workers, 0
	for _, d := range doms {
		total += d.room
	}
	list := doms
	if total < need {
		list = slices.Concat(doms, loners)
	}
	slices.SortStableFunc(list, func(a, b *packDomain) int {
		return cmp.Or(cmp.Compare(b.kept, a.kept), cmp.Compare(b.room, a.room), cmp.Compare(a.cost, b.cost), boolCmp(a.loner, b.loner), cmp.Compare(a.first, b.first))
	})
	var blocks [][]int32
	take := func(d *packDomain) {
		d.chosen = true
		need -= d.room
		blocks = append(blocks, d.nodes)
	}
	for _, d := range list {
		if d.kept > 0 {
			take(d)
		}
	}
	for need > 0 {
		var largest *packDomain
		for _, d := range list {
			if !d.chosen && d.room > 0 {
				largest = d
				break
			}
		}
		if largest == nil {
			break
		}
		if largest.room < need {
			take(largest)
			continue
		}
		// The remainder: the domain with the least room that holds it
		// (list is by room, most first: the last that holds it).
		fit := largest
		for _, d := range list {
			if !d.chosen && d.room >= need && d.room < fit.room {
				fit = d
			}
		}
		take(fit)
	}
	rest := list
	if len(list) == len(doms) {
		rest = slices.Concat(list, loners)
	}
	for _, d := range rest {
		if !d.chosen {
			blocks = append(blocks, d.nodes)
		}
	}
	return blocks
}

// nodeRank is how rankNodes orders a unit's candidates: per node (table
// position) the cost of taking it, the weight of the needy later units
// that may use it, and with bestFit its room for the unit.
type nodeRank struct {
	costs []float64
	fit   []int
}

// rankNodes weighs the nodes of order for u; nil when nothing would move
// (no needy unit after it that may use one of them, no bestFit).
func (e *engine) rankNodes(order []int32, u *unit, later []*unit) *nodeRank {
	var needy []*unit
	for _, v := range later {
		if v.needy {
			needy = append(needy, v)
		}
	}
	if len(needy) == 0 && !e.bestFit {
		return nil
	}
	r := &nodeRank{costs: make([]float64, len(e.table))}
	if e.bestFit {
		r.fit = make([]int, len(e.table))
	}
	moved := false
	for _, at := range order {
		for _, v := range needy {
			if v.mayUse(e, at) {
				r.costs[at] += v.weight
			}
		}
		if r.fit != nil {
			r.fit[at] = e.roomOf(e.table[at], u.c, u.g)
		}
		moved = moved || r.costs[at] > 0 || r.fit != nil
	}
	if !moved {
		return nil
	}
	return r
}

// sort orders nodes as rankNodes ranks them: those later units need least first,
// with bestFit the least room for the unit first among equals; stable,
// so that nodes alike keep their order.
func (r *nodeRank) sort(nodes []int32) {
	slices.SortStableFunc(nodes, func(a, b int32) int {
		if c := cmp.Compare(r.costs[a], r.costs[b]); c != 0 || r.fit == nil {
			return c
		}
		return cmp.Compare(r.fit[a], r.fit[b])
	})
}

// boolCmp orders false before true.
func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// meanCost is how much later units need nodes, on average.
func (r *nodeRank) meanCost(nodes []int32) float64 {
	sum := 0.0
	for _, at := range nodes {
		sum += r.costs[at]
	}
	return sum / float64(max(len(nodes), 1))
}

// chooseStrict picks the NVLink domain strict unit u keeps to, where
// strictDomain would pick the first with room: of the domains with room
// for all its workers, one that starves no later unit (a later unit
// that may not share u's GPUs, left too few GPUs it may use elsewhere
// once u took its own from the domain), then the one the needy units
// after it need least, then the one with the least room (best fit: a
// domain with room to spare is left to the units after it), the first in
// rank order among equals. A group that holds workers already (a
// replan) keeps to its domain.
func (e *engine) chooseStrict(u *unit, later []*unit) {
	key := u.lead()
	if _, ok := e.strict[key]; ok || e.homeDomain(u.c, u.g) != "" {
		return
	}
	var rivals []*unit // later units that may not share u's GPUs
	for _, v := range later {
		if v.gpus > 0 && (v.c == u.c || e.rules.conflict[u.c][v.c]) {
			rivals = append(rivals, v)
		}
	}
	type domain struct {
		room int
		cost float64
		// gpus are the domain's GPUs u may take now; in, per rival, those
		// of them the rival may use.
		gpus int
		in   []int
	}
	by := map[string]*domain{}
	var ids []string
	all := make([]int32, len(e.table))
	for i := range all {
		all[i] = int32(i)
	}
	for _, at := range rankOrder(e.table, all) {
		ns := e.table[at]
		id := domainOf(ns)
		d := by[id]
		if d == nil {
			d = &domain{in: make([]int, len(rivals))}
			by[id] = d
			ids = append(ids, id)
		}
		room := e.roomOf(ns, u.c, u.g)
		d.room += room
		if room > 0 {
			for _, v := range later {
				if v.needy && v.mayUse(e, at) {
					d.cost += v.weight
				}
			}
			mine, _ := e.allowedGPUs(ns, key, ns.usable, workerGPUs(e.groupSpec(key)))
			free := 0
			for _, x := range mine {
				if e.fits(ns, u.c, x, sliver) {
					free++
				}
			}
			d.gpus += free
			for i, v := range rivals {
				if v.mayUse(e, at) {
					theirs, _ := e.allowedGPUs(ns, v.lead(), ns.usable, workerGPUs(e.groupSpec(v.lead())))
					d.in[i] += min(free, len(theirs))
				}
			}
		}
	}
	uGPUs := u.gpus
	if uGPUs == 0 {
		w := e.groupSpec(u.lead())
		w.WorkerNum = u.workers
		uGPUs = gpusNeeded([]WorkerGroup{w})
	}
	// u takes its GPUs first where the rival may not go: the rival loses
	// only what u must take of its own.
	starves := func(d *domain) int {
		n := 0
		for i, v := range rivals {
			lost := min(d.in[i], max(0, uGPUs-(d.gpus-d.in[i])))
			if v.room-lost < v.gpus {
				n++
			}
		}
		return n
	}
	best, bestStarves := "", 0
	for _, id := range ids {
		d := by[id]
		if d.room < u.workers {
			continue
		}
		s := starves(d)
		if b := by[best]; best == "" || s < bestStarves || s == bestStarves && (d.cost < b.cost || d.cost == b.cost && d.room < b.room) {
			best, bestStarves = id, s
		}
	}
	if best == "" {
		return // none has room for all: strictDomain picks the one with most
	}
	if e.strict == nil {
		e.strict = map[group]string{}
	}
	e.strict[key] = best
}

// mayUse reports whether the unit could hold a worker on node at were it
// empty, remembered for the run.
func (u *unit) mayUse(e *engine, at int32) bool {
	if u.may == nil {
		u.may = make([]bool, len(e.table))
		for i, ns := range e.table {
			u.may[i] = e.emptyRoom(ns, u.lead(), layerLink) > 0
		}
	}
	return u.may[at]
}

// lookahead keeps a unit off the room the units after it need, a step
// past rankNodes' preference: no node gives the unit so many of its free
// GPUs that the later units could no longer fit even in the relaxation
// that counts GPUs alone (no worker sizes, no links). For every set S of
// the later units (at most maxGuarded of them), what they ask must fit in
// the free GPUs of the nodes any of them may use (Hall's condition, with
// a node's GPUs counted once): a node's slack is the least margin of the
// sets whose nodes it is among. The later units it guards are those whose
// GPUs the unit would take: of its own component, or one it may not share
// a GPU with; and no two of them may share one (colocate's train and
// eval, say, hold the same GPUs: their asks do not add up).
type lookahead struct {
	units []*unit
	// mask is, per node (table position), the guarded units that may use
	// it (bit i: units[i]); free, its GPUs one of them could still take.
	mask []uint8
	free []int
	// ask and room are per set of units (bit mask): what they ask, in
	// GPUs, and the free GPUs of the nodes any of them may use.
	ask, room []float64
}

// maxGuarded bounds the units a lookahead guards (sets: 2^maxGuarded).
const maxGuarded = 6

// lookahead sets up the guard of u's pass; src are the run's nodes with
// room (a node without is no room for anyone). nil when there is nothing
// to guard, or when the later units do not fit even now (then holding
// back helps no one).
func (e *engine) lookahead(u *unit, later []*unit, src []int32) *lookahead {
	var guard []*unit
	for _, v := range later {
		if len(guard) == maxGuarded {
			break
		}
		if v.c != u.c && !e.rules.conflict[u.c][v.c] || v.gpus == 0 {
			continue
		}
		shares := false
		for _, w := range guard {
			shares = shares || w.c != v.c && !e.rules.conflict[w.c][v.c]
		}
		if !shares {
			guard = append(guard, v)
		}
	}
	if len(guard) == 0 {
		return nil
	}
	la := &lookahead{units: guard, mask: make([]uint8, len(e.table)), free: make([]int, len(e.table)),
		ask: make([]float64, 1<<len(guard)), room: make([]float64, 1<<len(guard))}
	for s := range la.ask {
		for i, v := range guard {
			if s&(1<<i) != 0 {
				w := e.groupSpec(v.lead())
				la.ask[s] += float64(v.workers) * w.NumGPUs
			}
		}
	}
	for _, at := range src {
		for i, v := range guard {
			if v.mayUse(e, at) {
				la.mask[at] |= 1 << i
			}
		}
		if la.mask[at] == 0 {
			continue
		}
		la.free[at] = la.count(e, e.table[at])
		la.add(at, float64(la.free[at]))
	}
	for s := 1; s < len(la.ask); s++ {
		if la.room[s]+eps < la.ask[s] {
			return nil
		}
	}
	return la
}

// count is the GPUs of ns one of the guarded units could still take a
// share of.
func (la *lookahead) count(e *engine, ns *nodeState) int {
	n := 0
	for _, x := range ns.usable {
		for _, v := range la.units {
			if e.fits(ns, v.c, x, sliver) {
				n++
				break
			}
		}
	}
	return n
}

// add adds free GPUs of node at to the room of every set of units that
// may use it.
func (la *lookahead) add(at int32, free float64) {
	m := int(la.mask[at])
	for s := 1; s < len(la.room); s++ {
		if s&m != 0 {
			la.room[s] += free
		}
	}
}

// slack is how many of node at's wholly free GPUs the unit may take:
// negative, no bound.
func (la *lookahead) slack(at int32) int {
	if la == nil || la.mask[at] == 0 {
		return -1
	}
	m := int(la.mask[at])
	least := -1.0
	for s := 1; s < len(la.room); s++ {
		if s&m != 0 {
			if margin := la.room[s] - la.ask[s]; least < 0 || margin < least {
				least = margin
			}
		}
	}
	return int(least + eps)
}

// update counts node at's free GPUs again after the unit filled it.
func (la *lookahead) update(e *engine, at int32) {
	if la == nil || la.mask[at] == 0 {
		return
	}
	now := la.count(e, e.table[at])
	la.add(at, float64(now-la.free[at]))
	la.free[at] = now
}
