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
// engine: may group g use this node, and which of its GPUs. Fresh
// placement (fill: gate, fits, cpusFor, pickLinked), keeping a worker in
// a replan (keepOne: keepAllowed, keepGPU's fits, cpusFor), manual pools
// (placeOne), the room NVLink domains, the scarce-first order and the
// errors reason with (roomOf, emptyRoom), and so Validate and the
// several-plans allocator (PlanAll), which run the engine, all ask it
// here. Each link returns "" or why not (a Reason constant or a
// constraint's own reason), recorded by the caller (why.go); the links
// run cheapest and node-wide first, so that a node one of them rules out
// is passed over whole:
//
//  1. nodeCheck: the node's facts (labels; with strict, its NVLink
//     domain) allow the group at all;
//  2. allowedGPUs: which GPUs its gpu_model and min_gpu_memory_gb allow,
//     none being a reason of its own;
//  3. fits: what the other workers (and a buffer's reserve) leave of
//     one GPU;
//  4. cpusFor: the CPUs one more worker costs there;
//  5. linkCheck / pickLinked: how a multi-GPU worker's GPUs are linked.

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

// fits is the third link, the check of one GPU: component ci may take frac
// more of GPU g of ns. Its own share must leave room, no component it may
// not share with may hold the GPU, and a GPU reserved for a buffer counts
// as train's.
func (e *engine) fits(ns *nodeState, ci comp, g int, frac float64) bool {
	if ns.share[ci][g]+frac > 1+eps {
		return false
	}
	if ns.resv != nil && ns.resv[g] && (ci == compTrain || e.rules.conflict[ci][compTrain]) {
		return false
	}
	for cj := range ns.share {
		if e.rules.conflict[ci][cj] && ns.share[cj][g] > eps {
			return false
		}
	}
	return true
}

// gate is what fill and keepOne ask of a node first: the first two links
// for group g, for a worker of count GPUs among gpus. A reason is set
// when the node cannot serve the group at all.
func (e *engine) gate(ns *nodeState, g group, gpus []int, count int) ([]int, string) {
	if why := e.nodeCheck(ns, g, count, true); why != "" {
		return nil, why
	}
	if out, ok := e.allowedGPUs(ns, g, gpus, count); ok {
		return out, ""
	}
	return nil, e.memo(g).gpuWhy
}

// cpusFor is the fourth link's price: the CPUs the next worker of
// component c costs on ns. A node's first train worker also reserves its
// buffer worker's CPUs (the one place that rule is written).
func (e *engine) cpusFor(ns *nodeState, c comp, g WorkerGroup) float64 {
	if c == compTrain && e.hasBuffer && ns.count[compTrain] == 0 {
		return g.NumCPUs + e.bufferCPUs
	}
	return g.NumCPUs
}

// linkCheck is the fifth link for a worker already holding gpus (a kept
// worker): they are linked as its group's gpu_link asks.
func (e *engine) linkCheck(n *Node, g group, gpus []int) string {
	c := e.con(g)
	if c == nil || len(gpus) < 2 || linked(n, gpus, c.GPULink) {
		return ""
	}
	return linkReason(c.GPULink, len(gpus))
}

// emptyRoom is how many workers of group g ns could hold were it empty
// of this plan's workers (its usable GPUs, its free CPUs): the room the
// scarcity order, the avoidance of needed nodes and the binding
// constraint of an error reason with. layers limits which constraints
// count (see layer), so that an error can find the one that binds.
func (e *engine) emptyRoom(ns *nodeState, g group, upTo layer) int {
	w := e.groupSpec(g)
	count, frac := gpuCount(w)
	if count == 0 {
		return 0
	}
	c := e.con(g)
	if upTo >= layerSelector && c.any() && !c.nodeOK(ns.node) {
		return 0
	}
	gpus := ns.usable
	if upTo >= layerModel {
		gpus, _ = e.allowedGPUs(ns, g, gpus, count)
	}
	n := 0
	switch {
	case count == 1:
		n = len(gpus) * int((1+eps)/frac)
	case upTo >= layerLink && c != nil && (c.GPULink == LinkNUMA || c.GPULink == LinkNVLink):
		n = linkedSets(ns.node, gpus, count, c.GPULink)
	default:
		n = len(gpus) / count
	}
	if w.NumCPUs > 0 {
		n = min(n, int((ns.node.cpusFree()+eps)/w.NumCPUs))
	}
	return n
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
