package planner

import (
	"math"
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// comp is a component that holds GPUs, as the engine counts them: train,
// eval, env (buffers follow train and hold none of their own).
type comp int

const (
	compTrain comp = iota
	compEval
	compEnv
)

// Component is the component's name in documents and messages.
func (c comp) Component() plan.Component { return plan.GPUComponents[c] }

// compOf is component c as the engine counts it; buffers and unknown
// components are out of range (nComp and more, or negative).
func compOf(c plan.Component) comp { return comp(c.Rank()) }

// bit is the component in a mask of components.
func (c comp) bit() uint8 { return 1 << c }

// group is one scheduling group: env's groups are scheduling.env[i],
// train and eval have one each.
type group struct {
	c comp
	i int
}

// The feasibility chain answers one question for every part of the
// engine: may one more worker of group g go on this node, and on which
// of its GPUs. feasible is its one entry point: fresh placement (fill),
// keeping a worker in a replan (keepOne: the worker's own GPUs), manual
// pools (placeOne, and the order placeCounted tries on a scratch copy)
// all ask it, so that a fresh plan, its replan and its export loaded in
// manual mode cannot disagree on what fits; holds asks the same links for
// how many workers a node holds, now or were it empty (NVLink domains,
// the scarce-first order, the errors). The links run cheapest and
// node-wide first, so that a node one of them rules out is passed over
// whole:
//
//  1. nodeCheck: the node's facts (labels; with strict, its NVLink
//     domain) allow the group at all;
//  2. allowedGPUs: which GPUs its gpu_model and min_gpu_memory_gb allow,
//     none being a reason of its own;
//  3. cpusFor: the CPUs one more worker costs there;
//  4. fits: what the other workers (and a buffer's reserve) leave of
//     one GPU;
//  5. pickLinked / linkCheck: how a multi-GPU worker's GPUs are linked.
//
// A refusal says which link refused (typed, for the caller to act on)
// and the reason the caller records (why.go).

// chainLink is the link of the feasibility chain that refused a worker.
type chainLink uint8

const (
	chainOK     chainLink = iota
	chainNode             // 1: the node's facts rule the group out
	chainModel            // 2: no GPU of the node is of a model and memory allowed
	chainCPUs             // 3: too few CPUs left
	chainTooFew           // fewer allowed GPUs than a worker takes
	chainShare            // 4: no allowed GPU (or not enough) has room left
	chainLinked           // 5: no GPUs free linked as gpu_link asks
)

// refusal is why the chain turned a worker away: the link, the reason
// recorded, and for a kept worker the GPU at fault (-1: none).
type refusal struct {
	link   chainLink
	reason string
	gpu    int
}

// ok reports whether the chain let the worker through.
func (r refusal) ok() bool { return r.link == chainOK }

// probe is one asking of the chain for workers of group g on node ns,
// among offer (the node's usable GPUs, or a manual pool's there), asked
// again for each next worker a caller places there: it remembers what
// the node-wide links answered and how far picking went. kept asks for
// a kept worker instead: offer is its GPUs, which must all pass.
type probe struct {
	ns    *nodeState
	g     group
	offer []int
	kept  bool
	// gated: the node-wide links ran; gpus are then the offered GPUs the
	// group's constraints allow, why their refusal.
	gated bool
	gpus  []int
	why   refusal
	pos   int
	// compromise: the last worker's prefer-nvlink settled for less.
	compromise bool
}

// newProbe asks the chain about group g's workers on ns among offer.
func newProbe(ns *nodeState, g group, offer []int) probe {
	return probe{ns: ns, g: g, offer: offer}
}

// feasible is the chain's entry point: whether the next worker of the
// probe's group may go on its node, on which GPUs (nil for a worker
// without GPUs; a window of the offer no one changes, or a list of its
// own) and at what CPUs; else the refusal. It writes nothing but the
// probe.
func (e *engine) feasible(p *probe) (held []int, cpus float64, r refusal) {
	ns, g := p.ns, p.g
	w := e.groupSpec(g)
	count, frac := gpuCount(w)
	if p.kept {
		return e.feasibleKept(p, w, count, frac)
	}
	if r := e.nodeWide(p, count); !r.ok() {
		return nil, 0, r
	}
	cpus = e.cpusFor(ns, g.c, w)
	if cpus > ns.cpuLeft+eps {
		return nil, cpus, refusal{link: chainCPUs, reason: ReasonCPUsExhausted, gpu: -1}
	}
	p.compromise = false
	switch {
	case count == 0:
		return nil, cpus, refusal{}
	case len(p.gpus) < count:
		return nil, cpus, refusal{link: chainTooFew, reason: e.tooFew(ns, g, count), gpu: -1}
	case count == 1:
		// A fractional worker's GPU takes the next ones while they fit:
		// picking stays on it.
		for p.pos < len(p.gpus) && !e.fits(ns, g.c, p.gpus[p.pos], frac) {
			p.pos++
		}
		if p.pos == len(p.gpus) {
			return nil, cpus, refusal{link: chainShare, reason: ReasonNoFreeGPUs, gpu: -1}
		}
		at := p.pos
		if frac < 1 && ns.shareOf(g.c)[p.gpus[at]] <= eps {
			// A share goes beside its component's own on a GPU it partly
			// holds before it opens one: a plan filled in order holds no
			// such GPU past the first that fits, but one replanned keeps
			// its workers where they were, and a worker it adds would
			// otherwise open a GPU that a plan made afresh leaves free.
			for i := at + 1; i < len(p.gpus); i++ {
				if x := p.gpus[i]; ns.shareOf(g.c)[x] > eps && e.fits(ns, g.c, x, frac) {
					at = i
					break
				}
			}
		}
		return p.gpus[at : at+1 : at+1], cpus, refusal{}
	}
	held, why, compromise := e.pickLinked(ns, g.c, g.i, p.gpus, &p.pos, count)
	switch {
	case held == nil && why != "":
		return nil, cpus, refusal{link: chainLinked, reason: why, gpu: -1}
	case held == nil:
		return nil, cpus, refusal{link: chainShare, reason: ReasonNoFreeGPUs, gpu: -1}
	}
	p.compromise = compromise
	return held, cpus, refusal{}
}

// nodeWide runs the chain's node-wide links (1 and 2) for the probe's
// group, once per probe: whether the node may serve the group at all,
// and which of the offered GPUs it may use (p.gpus).
func (e *engine) nodeWide(p *probe, count int) refusal {
	if !p.gated {
		p.gated = true
		if why := e.nodeCheck(p.ns, p.g, count, true); why != "" {
			p.why = refusal{link: chainNode, reason: why, gpu: -1}
		} else if out, ok := e.allowedGPUs(p.ns, p.g, p.offer, count); ok {
			p.gpus = out
		} else {
			p.why = refusal{link: chainModel, reason: e.memo(p.g).gpuWhy, gpu: -1}
		}
	}
	return p.why
}

// feasibleKept is feasible for a kept worker on its own GPUs (the
// probe's offer): the links a new worker meets, bar the strict domain
// (checked over the whole plan: strictSpread), on exactly those GPUs.
func (e *engine) feasibleKept(p *probe, w WorkerGroup, count int, frac float64) ([]int, float64, refusal) {
	ns, g, gpus := p.ns, p.g, p.offer
	if why := e.nodeCheck(ns, g, len(gpus), false); why != "" {
		return nil, 0, refusal{link: chainNode, reason: why, gpu: -1}
	}
	if allowed, ok := e.allowedGPUs(ns, g, gpus, len(gpus)); !ok || len(allowed) != len(gpus) {
		return nil, 0, refusal{link: chainModel, reason: e.memo(g).gpuWhy, gpu: -1}
	}
	for _, x := range gpus {
		if !e.fitsKept(ns, g.c, x, frac) {
			return nil, 0, refusal{link: chainShare, reason: ReasonNoFreeGPUs, gpu: x}
		}
	}
	cpus := e.cpusFor(ns, g.c, w)
	if cpus > ns.cpuLeft+eps {
		return nil, cpus, refusal{link: chainCPUs, reason: ReasonCPUsExhausted, gpu: -1}
	}
	if why := e.linkCheck(ns.node, g, gpus); why != "" {
		return nil, cpus, refusal{link: chainLinked, reason: why, gpu: -1}
	}
	return gpus, cpus, refusal{}
}

// con is group g's constraints (nil: none).
func (e *engine) con(g group) *Constraints { return e.cons[g.c][g.i] }

// spec is group g's scheduling entry.
func (e *engine) groupSpec(g group) WorkerGroup { return e.demands[g.c].groups[g.i] }

// nodeCheck is the first link: whether group g, whose workers take count
// GPUs each, may use ns at all. strict says whether the NVLink domain a
// strict group keeps to is checked (it is chosen as the group is first
// placed: the static room the search reasons with leaves it out).
func (e *engine) nodeCheck(ns *nodeState, g group, count int, strict bool) string {
	if ns.node.Out {
		// A node drained whole takes nothing, not even a worker that
		// needs neither GPUs nor CPUs.
		return ReasonDrained
	}
	c := e.con(g)
	if !c.any() {
		return ""
	}
	if !c.nodeOK(ns.node) {
		return e.memo(g).nodeWhy
	}
	if strict && c.NVLinkDomain == DomainStrict && count > 0 {
		if want := e.strictDomain(g.c, g.i); want != "" && domainOf(ns) != want {
			return strictReason(g.c.Component())
		}
	}
	return ""
}

// allowedGPUs is the second link: which of gpus (a node's usable GPUs,
// or a manual pool's there) group g's gpu_model and min_gpu_memory_gb
// allow on ns; ok is false when they allow none (the reason is the
// group's gpuReason). The list is gpus itself when every GPU is allowed.
func (e *engine) allowedGPUs(ns *nodeState, g group, gpus []int, count int) (out []int, ok bool) {
	c := e.con(g)
	if count == 0 || !c.any() || !c.gpuWise() {
		return gpus, true
	}
	first := slices.IndexFunc(gpus, func(x int) bool { return !e.gpuAllowed(g, ns.node, x) })
	if first < 0 {
		return gpus, len(gpus) > 0 // every GPU matches: no copy
	}
	out = slices.Clip(gpus[:first:first])
	for _, x := range gpus[first:] {
		if e.gpuAllowed(g, ns.node, x) {
			out = append(out, x)
		}
	}
	return out, len(out) > 0
}

// gpuAllowed reports whether group g's constraints allow GPU x of n. A
// model's match is remembered per group: at twenty thousand nodes the
// same few names come back for every GPU, most often the last one's.
func (e *engine) gpuAllowed(g group, n *Node, x int) bool {
	c := e.con(g)
	if !c.gpuWise() {
		return true
	}
	if len(c.GPUModels) > 0 && (x >= len(n.Models) || !e.memo(g).match(c, n.Models[x])) {
		return false
	}
	return c.MinGPUMemoryGB <= 0 || x < len(n.MemoryBytes) && n.MemoryBytes[x] >= c.minMemoryBytes()
}

// groupMemo is what the chain remembers of a group for a run: which GPU
// models its gpu_model matches (the last asked first) and its reasons,
// which do not change.
type groupMemo struct {
	last    string
	lastOK  bool
	models  map[string]bool
	gpuWhy  string // its constraints' gpuReason
	nodeWhy string // and nodeReason
}

// memo is group g's memo, made on first use.
func (e *engine) memo(g group) *groupMemo {
	m := e.memos[g]
	if m == nil {
		if e.memos == nil {
			e.memos = map[group]*groupMemo{}
		}
		m = &groupMemo{models: map[string]bool{}}
		if c := e.con(g); c.any() {
			m.gpuWhy, m.nodeWhy = c.gpuReason(), c.nodeReason()
		}
		e.memos[g] = m
	}
	return m
}

// match reports whether model is one of c's gpu_model.
func (m *groupMemo) match(c *Constraints, model string) bool {
	if len(m.models) > 0 && model == m.last {
		return m.lastOK
	}
	ok, seen := m.models[model]
	if !seen {
		ok = c.modelOK(model)
		m.models[model] = ok
	}
	m.last, m.lastOK = model, ok
	return ok
}

// fits is the fourth link, the check of one GPU: component ci may take frac
// more of GPU g of ns. Its own share must leave room, no component it may
// not share with may hold the GPU, and a GPU reserved for a buffer counts
// as train's.
func (e *engine) fits(ns *nodeState, ci comp, g int, frac float64) bool {
	if ns.shareOf(ci)[g]+frac > 1+eps {
		return false
	}
	if ns.resv() != nil && ns.resv()[g] && (ci == compTrain || e.rules.conflict[ci][compTrain]) {
		return false
	}
	for cj := range comp(nComp) {
		if e.rules.conflict[ci][cj] && ns.shareOf(cj)[g] > eps {
			return false
		}
	}
	return true
}

// fitsKept is fits for a kept worker. A share of eps or less holds no
// GPU, so fits lets a component it may not share with go beside it (and
// reserve its GPU for a buffer), but does not let it go beside such a
// component: the pair is one the engine makes in one order and refuses in
// the other. A kept worker is checked again in its document's order (a
// restarted planner, adoptSlow) and not in the order it was placed in (a
// running planner kept its state), so a tiny share kept is held to its
// own component's room alone, as its plan's state holds it: it stays
// where it fits either way.
func (e *engine) fitsKept(ns *nodeState, ci comp, g int, frac float64) bool {
	if frac <= eps {
		return ns.shareOf(ci)[g]+frac <= 1+eps
	}
	return e.fits(ns, ci, g, frac)
}

// cpusFor is the third link's price: the CPUs the next worker of
// component c costs on ns. A node's first train worker also reserves its
// buffer worker's CPUs (the one place that rule is written).
func (e *engine) cpusFor(ns *nodeState, c comp, g WorkerGroup) float64 {
	if c == compTrain && e.hasBuffer && ns.count[compTrain] == 0 {
		return g.NumCPUs + e.bufferCPUs
	}
	return g.NumCPUs
}

// linkCheck is the fifth link for a worker already holding gpus (a kept
// worker; pickLinked links a new one): they are linked as its group's gpu_link asks.
func (e *engine) linkCheck(n *Node, g group, gpus []int) string {
	c := e.con(g)
	if c == nil || len(gpus) < 2 || linked(n, gpus, c.GPULink) {
		return ""
	}
	return linkReason(c.GPULink, len(gpus))
}

// holds is how many workers of group g ns could hold, by the chain's
// links: with empty, were it empty of this plan's workers (its usable
// GPUs, its free CPUs): the room the scarcity order, the avoidance of
// needed nodes and the binding constraint of an error reason with, upTo
// limiting which constraints count (see layer), so that an error can
// find the one that binds; else now (what this plan's workers and a
// buffer's reserve leave of its GPUs, whole GPUs for a worker of
// several, and of its CPUs), with every constraint: the room NVLink
// domains are chosen by.
func (e *engine) holds(ns *nodeState, g group, empty bool, upTo layer) int {
	if g.i >= len(e.demands[g.c].groups) {
		return 0
	}
	w := e.groupSpec(g)
	count, frac := gpuCount(w)
	if count == 0 {
		return 0
	}
	c := e.con(g)
	if upTo >= layerSelector && e.nodeCheck(ns, g, count, false) != "" {
		return 0
	}
	gpus := ns.usable
	if upTo >= layerModel {
		gpus, _ = e.allowedGPUs(ns, g, gpus, count)
	}
	n := 0
	switch {
	case count == 1 && !empty:
		// What is left of each GPU: fractional workers fill a GPU
		// another of the component's workers holds part of.
		for _, x := range gpus {
			if e.fits(ns, g.c, x, frac) {
				n += int((1 + eps - ns.shareOf(g.c)[x]) / frac)
			}
		}
	case count == 1:
		n = len(gpus) * int((1+eps)/frac)
	default:
		if !empty {
			var free []int
			for _, x := range gpus {
				if e.fits(ns, g.c, x, 1) {
					free = append(free, x)
				}
			}
			gpus = free
		}
		if upTo >= layerLink && c != nil && (c.GPULink == LinkNUMA || c.GPULink == LinkNVLink) {
			n = linkedSets(ns.node, gpus, count, c.GPULink)
		} else {
			n = len(gpus) / count
		}
	}
	if w.NumCPUs > 0 {
		left := ns.cpusFree()
		if !empty {
			// The node's first train worker also pays for its buffer.
			left = ns.cpuLeft - (e.cpusFor(ns, g.c, w) - w.NumCPUs)
		}
		n = min(n, max(0, int((left+eps)/w.NumCPUs)))
	}
	return n
}

// emptyRoom is what ns holds of group g were it empty of this plan's
// workers.
func (e *engine) emptyRoom(ns *nodeState, g group, upTo layer) int { return e.holds(ns, g, true, upTo) }

// roomOf is what ns holds of group gi of component ci now.
func (e *engine) roomOf(ns *nodeState, ci comp, gi int) int {
	return e.holds(ns, group{ci, gi}, false, layerLink)
}

// layer is how many of a group's constraints emptyRoom counts, in the
// order an error names the one that binds: the worker's size alone, then
// node_selector, then gpu_model and min_gpu_memory_gb, then gpu_link.
// (nvlink_domain strict binds over domains, not nodes: see binding.)
type layer int

const (
	layerSize layer = iota
	layerSelector
	layerModel
	layerLink
)

// linkedSets is how many disjoint sets of count GPUs of gpus, linked as
// link asks, a node holds: per NUMA node its GPUs by count; NVLink
// cliques taken greedily, one after another.
func linkedSets(n *Node, gpus []int, count int, link string) int {
	if link == LinkNUMA {
		by := map[int]int{}
		for _, g := range gpus {
			if g < len(n.NUMA) && n.NUMA[g] >= 0 {
				by[n.NUMA[g]]++
			}
		}
		sets := 0
		for _, k := range by {
			sets += k / count
		}
		return sets
	}
	free := slices.Clone(gpus)
	sets := 0
	for len(free) >= count {
		held := clique(free, count, n.Peers)
		if held == nil {
			break
		}
		sets++
		free = slices.DeleteFunc(free, func(g int) bool { return slices.Contains(held, g) })
	}
	return sets
}

// workerGPUs is how many GPUs a worker of w takes, for the checks that
// count whole GPUs (a fractional worker takes one).
func workerGPUs(w WorkerGroup) int { return int(math.Ceil(w.NumGPUs)) }

// strictGroup reports whether group g keeps to one NVLink domain.
func (e *engine) strictGroup(g group) bool {
	c := e.con(g)
	return c != nil && c.NVLinkDomain == DomainStrict
}
