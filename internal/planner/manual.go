package planner

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// ErrMixedNodesNeedIDs is rlightning's message for a manual pool without
// node_ids on a cluster whose nodes differ in GPU count.
const ErrMixedNodesNeedIDs = "Manual mode without specified node_ids requires per-node num_gpus to be a single value."

// manualPasses packs the workers into the spec's pools: pools in order,
// nodes in pool order, on each node its components in order. A component
// the pools give worker_counts is placed by them (placeCounted); the others
// as rlightning packs, onto their GPUs there, workers without GPUs beside
// them.
func (e *engine) manualPasses() {
	exact := e.exactCounts()
	var queues [nComp][][]int
	for _, d := range e.demands {
		ci := d.ci
		if exact[ci] {
			queues[ci] = e.queues(d)
		}
	}
	for _, p := range e.pools {
		for _, en := range p.entries {
			for _, d := range e.demands {
				ci := d.ci
				switch {
				case exact[ci]:
					e.placeCounted(p, en, d, queues[ci])
				case len(en.gpus[ci]) > 0:
					e.fill(target{pool: p, entry: en}, en.at, d, en.gpus[ci])
				}
			}
		}
	}
	for _, d := range e.demands {
		ci := d.ci
		if exact[ci] {
			var left []int
			for _, q := range queues[ci] {
				left = append(left, q...)
			}
			slices.Sort(left)
			d.only(left)
		}
	}
}

// placeCounted places on a pool entry the workers its worker_counts give
// it, group by group, each taking the next index of its group's queue.
// The counts come from a plan that fitted them there, in whatever order
// it placed them: the groups go in the first order (countedOrder) in
// which all of them fit, as the chain decides on a scratch copy of the
// node, so that an export loads back whatever order made it.
func (e *engine) placeCounted(p *poolRun, en *poolEntry, d *demand, queue [][]int) {
	if en.counts[d.ci] == nil {
		return
	}
	tg := target{pool: p, entry: en}
	ns := e.mut(en.at)
	for _, gi := range e.countedOrder(en, d, queue) {
		pr := newProbe(ns, group{d.ci, gi}, en.gpus[d.ci])
		for en.placed[d.ci][gi] < en.counts[d.ci][gi] && len(queue[gi]) > 0 {
			if !e.placeOne(tg, en, d, &pr, queue[gi][0]) {
				break
			}
			queue[gi] = queue[gi][1:]
		}
	}
}

// maxCountedOrders bounds the orders of its groups countedOrder tries on
// one pool entry.
const maxCountedOrders = 24

// countedOrder is the order in which the groups of d go on pool entry
// en: the first, of at most maxCountedOrders, in which every worker the
// counts give it fits by the chain. Tried first: groups with GPU
// constraints (gpu_model, memory, gpu_link), the narrowest first, then
// larger workers first (first fit decreasing); then the other orders of
// the groups with workers here, in turn. Where none fits them all, the
// first, whose placement then says what did not fit.
func (e *engine) countedOrder(en *poolEntry, d *demand, queue [][]int) []int {
	ns := e.table[en.at]
	allowed := make([]int, len(d.groups))
	var groups []int
	for gi := range d.groups {
		if min(en.counts[d.ci][gi]-en.placed[d.ci][gi], len(queue[gi])) <= 0 {
			continue
		}
		groups = append(groups, gi)
		allowed[gi] = len(en.gpus[d.ci]) + 1
		if c := e.cons[d.ci][gi]; c.any() && (c.gpuWise() || c.GPULink != "") {
			gpus, _ := e.allowedGPUs(ns, group{d.ci, gi}, en.gpus[d.ci], workerGPUs(d.groups[gi]))
			allowed[gi] = len(gpus)
		}
	}
	slices.SortStableFunc(groups, func(a, b int) int {
		return cmp.Or(cmp.Compare(allowed[a], allowed[b]), cmp.Compare(d.groups[b].NumGPUs, d.groups[a].NumGPUs))
	})
	if len(groups) < 2 {
		return groups
	}
	// perm walks the orders of groups' positions, lexicographically.
	perm := make([]int, len(groups))
	for i := range perm {
		perm[i] = i
	}
	order := make([]int, len(groups))
	for range maxCountedOrders {
		for i, k := range perm {
			order[i] = groups[k]
		}
		if e.countsFit(en, d, queue, order) {
			return order
		}
		if !nextPerm(perm) {
			break
		}
	}
	return groups
}

// countsFit reports whether the workers pool entry en's counts give d's
// groups fit there in order, by the chain, on a scratch copy of the node.
func (e *engine) countsFit(en *poolEntry, d *demand, queue [][]int, order []int) bool {
	ns := e.table[en.at].clone(new(runToken))
	for _, gi := range order {
		pr := newProbe(ns, group{d.ci, gi}, en.gpus[d.ci])
		_, frac := gpuCount(d.groups[gi])
		for range min(en.counts[d.ci][gi]-en.placed[d.ci][gi], len(queue[gi])) {
			held, cpus, r := e.feasible(&pr)
			if !r.ok() {
				return false
			}
			ns.hold(d.ci, gi, held, frac, cpus, &e.extras)
		}
	}
	return true
}

// queues lists, per group, the indices d has still to place.
func (e *engine) queues(d *demand) [][]int {
	out := make([][]int, len(d.groups))
	for ; !d.done(); d.advance() {
		out[d.gi] = append(out[d.gi], d.index())
	}
	return out
}

// placeOne places worker index of group gi on the entry's node, where
// the chain lets it (p: the group's probe there, which picks first fit
// on the component's GPUs of the entry). It reports whether the worker
// fitted, and notes the node when not.
func (e *engine) placeOne(tg target, en *poolEntry, d *demand, p *probe, index int) bool {
	ns, gi := p.ns, p.g.i
	g := d.groups[gi]
	count, frac := gpuCount(g)
	if count > 0 && len(en.gpus[d.ci]) == 0 {
		e.filter(ns, d.ci, ReasonNoPoolGPUs)
		return false
	}
	held, cpus, r := e.feasible(p)
	if !r.ok() {
		e.filter(ns, d.ci, r.reason)
		return false
	}
	if p.compromise {
		e.filter(ns, d.ci, ReasonPreferNVLink)
	}
	if count == 0 {
		frac = 0
	}
	e.record(tg, en.at, ns, seat{c: d.ci, index: index, gi: gi, g: g, gpus: held, frac: frac, cpus: cpus})
	return true
}

// exactCounts says, per component, whether the pools give it
// worker_counts.
func (e *engine) exactCounts() [nComp]bool {
	var out [nComp]bool
	for _, pc := range e.spec.ResourcePool {
		for ci, c := range plan.GPUComponents {
			out[ci] = out[ci] || pc.WorkerCounts[c] != nil
		}
	}
	return out
}

// checkManual refuses pools that leave a component's workers nowhere to
// go, naming the component (rlightning silently leaves them unplaced),
// and worker_counts that do not add up to the spec's groups.
func (e *engine) checkManual() error {
	exact := e.exactCounts()
	for _, d := range e.demands {
		ci := d.ci
		if d.asked == 0 {
			continue
		}
		gpus := false
		sums := make([]int, len(d.groups))
		for _, p := range e.pools {
			for _, en := range p.entries {
				gpus = gpus || len(en.alloc[ci]) > 0
				for gi, k := range en.counts[ci] {
					sums[gi] += k
				}
			}
		}
		for gi, k := range e.skippedCounts[ci] {
			sums[gi] += k
		}
		needGPUs := gpusNeeded(d.groups) > 0
		switch {
		case e.skippedNodes > 0:
			// Degraded: the pools' nodes that left gave it GPUs.
		case needGPUs && !gpus:
			e.exhaust(ci, ReasonNoPoolGPUs, "")
			return &PlanError{Msg: fmt.Sprintf("Cannot place %s: %d workers, but no resource pool gives %s any GPUs", d.comp, d.asked, d.comp)}
		case !exact[ci] && !gpus:
			e.exhaust(ci, ReasonNoPoolGPUs, "")
			return &PlanError{Msg: fmt.Sprintf("Cannot place %s: %d workers without GPUs, but no resource pool gives %s GPUs to place them beside, or worker_counts", d.comp, d.asked, d.comp)}
		}
		for gi, g := range d.groups {
			if exact[ci] && sums[gi] != g.WorkerNum {
				return fieldErr("resource_pool", "worker_counts place %d %s of %s; it asks for %d", sums[gi], plural(sums[gi], "worker", "workers"), groupName(d.comp, gi), g.WorkerNum)
			}
		}
	}
	return nil
}

// groupName names group gi of component c as the spec does.
func groupName(c plan.Component, gi int) string {
	if c == plan.Env {
		return fmt.Sprintf("scheduling.env[%d]", gi)
	}
	return "scheduling." + string(c)
}

// loadPools reads rlightning's resource_pool list: each pool's nodes are
// its node_ids or, without them, the first nodes by id that no earlier
// pool took; index strings are pool-global, each node offset by the GPUs
// of the nodes before it.
func (e *engine) loadPools() error {
	mixed := false
	for _, ns := range e.table {
		mixed = mixed || ns.node.GPUs != e.table[0].node.GPUs
	}
	used := make([]bool, len(e.table))
	e.entries = map[entryKey]*poolEntry{}
	for i, pc := range e.spec.ResourcePool {
		field := fmt.Sprintf("resource_pool[%d]", i)
		nodes, err := e.poolNodes(field, pc, mixed, used)
		if err != nil {
			return err
		}
		p := &poolRun{name: pc.Name, auto: -1}
		offsets := make([]int, len(nodes)+1)
		var pos []int // each entry's position among nodes
		for j, at := range nodes {
			want := pc.NumGPUs[0]
			if pc.NumGPUsList {
				want = pc.NumGPUs[j]
			}
			if at >= 0 && want != e.table[at].node.GPUs && !e.degrade {
				n := e.table[at].node
				return fieldErr(field+".num_gpus", "says %d GPUs for node %s, which has %d", want, n.ID, n.GPUs)
			}
			for ci, c := range plan.GPUComponents {
				if counts := pc.WorkerCounts[c]; counts != nil && len(counts[j]) != len(e.demands[ci].groups) {
					return fieldErr(fmt.Sprintf("%s.worker_counts.%s[%d]", field, c, j), "gives %d counts; want one per scheduling group of %s (%d)", len(counts[j]), c, len(e.demands[ci].groups))
				}
			}
			offsets[j+1] = offsets[j] + want
			if at < 0 || want != e.table[at].node.GPUs {
				// Degraded: the node left, or changed; its share of the
				// pool's ranges and counts is not placed.
				e.skipPoolNode(pc, j)
				continue
			}
			used[at] = true
			en := &poolEntry{at: at, pool: len(e.pools)}
			for ci, c := range plan.GPUComponents {
				en.placed[ci] = make([]int, len(e.demands[ci].groups))
				if counts := pc.WorkerCounts[c]; counts != nil {
					en.counts[ci] = counts[j]
				}
			}
			p.entries = append(p.entries, en)
			pos = append(pos, j)
			if _, dup := e.entries[entryKey{pc.Name, at}]; !dup {
				e.entries[entryKey{pc.Name, at}] = en
			}
		}
		if err := e.loadRanges(field, pc, p, offsets, pos); err != nil {
			return err
		}
		e.pools = append(e.pools, p)
	}
	return e.checkManual()
}

// skipPoolNode notes that node j of pool pc takes no part in a degraded
// run (it left, or its GPUs changed): the worker_counts it would have
// had still count towards the spec's sums.
func (e *engine) skipPoolNode(pc PoolConfig, j int) {
	for ci, c := range plan.GPUComponents {
		if counts := pc.WorkerCounts[c]; counts != nil {
			if e.skippedCounts[ci] == nil {
				e.skippedCounts[ci] = make([]int, len(e.demands[ci].groups))
			}
			for gi, k := range counts[j] {
				e.skippedCounts[ci][gi] += k
			}
		}
	}
	e.skippedNodes++
}

// poolNodes resolves the nodes of pool pc.
func (e *engine) poolNodes(field string, pc PoolConfig, mixed bool, used []bool) ([]int32, error) {
	var nodes []int32
	if pc.NodeIDs != nil {
		for j, id := range pc.NodeIDs {
			at := e.find(id)
			if at < 0 && !e.degrade {
				return nil, fieldErr(fmt.Sprintf("%s.node_ids[%d]", field, j), "node %q is not in the inventory", id)
			}
			nodes = append(nodes, at) // -1, degraded: the node left
		}
		return nodes, nil
	}
	if (mixed || pc.NumGPUsList) && !e.degrade {
		return nil, &PlanError{Msg: ErrMixedNodesNeedIDs}
	}
	for at := range e.table {
		if len(nodes) == pc.NumNode {
			break
		}
		if !used[at] {
			nodes = append(nodes, int32(at))
		}
	}
	if len(nodes) < pc.NumNode && !e.degrade {
		return nil, &PlanError{Msg: fmt.Sprintf("Not enough nodes for resource pool %q: num_node is %d, %d unused nodes left", pc.Name, pc.NumNode, len(nodes))}
	}
	for len(nodes) < pc.NumNode {
		nodes = append(nodes, -1) // degraded: too few nodes are left
	}
	return nodes, nil
}

// loadRanges splits the pool-global index strings among the pool's nodes
// (entry k is node pos[k] of the pool, whose GPUs begin at offsets[pos[k]]).
func (e *engine) loadRanges(field string, pc PoolConfig, p *poolRun, offsets, pos []int) error {
	last := offsets[len(offsets)-1]
	for ci, c := range plan.GPUComponents {
		for _, r := range pc.Ranges[c] {
			if r.Last >= last {
				return fieldErr(field+"."+string(c), "index %d is beyond the pool's %d GPUs (0-%d)", r.Last, last, last-1)
			}
			for k, en := range p.entries {
				j := pos[k]
				lo, hi := max(r.First, offsets[j]), min(r.Last, offsets[j+1]-1)
				if lo > hi {
					continue
				}
				ns := e.table[en.at]
				for g := lo - offsets[j]; g <= hi-offsets[j]; g++ {
					if ns.holder(g) != "" {
						continue // another plan's (PlanAll): not this pool's
					}
					en.alloc[ci] = append(en.alloc[ci], g)
					if ns.freeGPU(g) {
						en.gpus[ci] = append(en.gpus[ci], g)
					}
				}
			}
		}
	}
	return nil
}

// entryKey names a manual pool's entry for a node.
type entryKey struct {
	pool string
	at   int32
}

// entryOf is the manual pool named pool and its entry for node at, or
// nils.
func (e *engine) entryOf(pool string, at int32) (*poolRun, *poolEntry) {
	if en := e.entries[entryKey{pool, at}]; en != nil {
		return e.pools[en.pool], en
	}
	return nil, nil
}
