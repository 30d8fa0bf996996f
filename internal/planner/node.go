package planner

import (
	"maps"
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// eps absorbs float error when fractional shares are summed (0.1 * 10).
const eps = 1e-9

// nComp is the number of components that hold GPUs: train, eval, env.
const nComp = len(plan.GPUComponents)

// Node is what the planner knows of one machine. A plan keeps the nodes
// it was planned on, the caller's slice itself and what its nodes refer
// to, for the next run that starts from it: do not change either after
// planning; give a changed inventory as a new slice.
type Node struct {
	ID   string
	IP   string
	CPUs float64
	// GPUs is the node's GPU count; indices 0..GPUs-1 are its index space.
	GPUs int
	// Unhealthy lists GPU indices that must never be given work.
	Unhealthy []int
	// GPUUUIDs, when known, maps index to UUID.
	GPUUUIDs []string
	// Models and MemoryBytes, when known, map index to the GPU's model
	// name (NVML's) and memory; Labels are the node's labels. Constraints
	// read them.
	Models      []string
	MemoryBytes []uint64
	Labels      map[string]string
	// Peers, when known, is per GPU the set (bit j: GPU j) of GPUs it
	// has an NVLink path to; NUMA, per GPU, its NUMA node (-1: unknown).
	// gpu_link reads them.
	Peers []uint64
	NUMA  []int
	// Domain is the node's NVLink domain (fabric clique); "" is a domain
	// of its own. nvlink_domain reads it.
	Domain string
	// HeldBy, when set, names per GPU the plan of a cluster shared by
	// several that holds it ("": none); this plan may not use a held GPU
	// (PlanAll); CPUsHeld, the CPUs those plans use.
	HeldBy   []string
	CPUsHeld float64
	// Drained lists GPU indices taken out of placement on purpose (an
	// operator's planner drain, or the planner holding a GPU out that
	// recovered or keeps failing): like an unhealthy GPU it gets no work,
	// but a worker that leaves it leaves for WhyDrained, so that the
	// plan says the drain is why. Out drains the whole node: no worker
	// stays or is placed there, whether it uses GPUs or not.
	Drained []int
	Out     bool
}

// Healthy reports whether GPU i may be given work: not unhealthy, not
// drained.
func (n *Node) Healthy(i int) bool {
	return !slices.Contains(n.Unhealthy, i) && !n.drained(i)
}

// drained reports whether GPU i is drained (Drained, or the node Out).
func (n *Node) drained(i int) bool {
	return n.Out || slices.Contains(n.Drained, i)
}

// free reports whether GPU i may be given this plan's work, as n's own
// marks have it.
func (n *Node) free(i int) bool { return markOf(n).free(n, i) }

// mark is what other plans hold of one node as a run sees it: per GPU
// the plan that holds it ("": none) and the CPUs they use. A node's own
// (HeldBy, CPUsHeld), or a remainder's over them (nodeView): a run's
// states keep theirs beside the node, so that a run on a cluster another
// plan holds whole (a shrink's taker beside a plan of every node) points
// at the caller's nodes instead of a copy of each with the holds
// written in (5.3 MB at 20,000 nodes). Never written once made.
type mark struct {
	heldBy []string
	cpus   float64
}

// markOf is n's own mark.
func markOf(n *Node) mark { return mark{n.HeldBy, n.CPUsHeld} }

// usable reports whether a run may use GPU g of n, marked m, at all (a
// state's usable GPUs).
func (m mark) usable(n *Node, g int) bool {
	return len(n.Unhealthy) == 0 && len(m.heldBy) == 0 && len(n.Drained) == 0 && !n.Out || m.free(n, g)
}

// cpusFree is the CPUs this plan may use of n, marked m: none on a node
// drained whole, so that no worker without GPUs lands there either.
func (m mark) cpusFree(n *Node) float64 {
	if n.Out {
		return 0
	}
	return max(0, n.CPUs-m.cpus)
}

// holder is the other plan that holds GPU i, "" when none does.
func (m mark) holder(i int) string {
	if i < 0 || i >= len(m.heldBy) {
		return ""
	}
	return m.heldBy[i]
}

// free reports whether GPU i of n, marked m, may be given this plan's
// work: healthy and held by no other plan.
func (m mark) free(n *Node, i int) bool {
	return n.Healthy(i) && m.holder(i) == ""
}

// equal reports whether two marks say the same.
func (m mark) equal(o mark) bool {
	return m.cpus == o.cpus && slices.Equal(m.heldBy, o.heldBy)
}

// hasUUIDs reports whether the node names every GPU by UUID.
func (n *Node) hasUUIDs() bool { return len(n.GPUUUIDs) == n.GPUs && n.GPUs > 0 }

// sameMachine reports whether a and b describe the machine alike (other
// plans' holds aside: a state keeps its mark), so that a plan made for
// one holds for the other.
func sameMachine(a, b *Node) bool {
	if a == b {
		return true
	}
	return a.ID == b.ID && a.IP == b.IP && a.CPUs == b.CPUs && a.GPUs == b.GPUs &&
		slices.Equal(a.Unhealthy, b.Unhealthy) && slices.Equal(a.GPUUUIDs, b.GPUUUIDs) &&
		slices.Equal(a.Models, b.Models) && slices.Equal(a.MemoryBytes, b.MemoryBytes) && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.Peers, b.Peers) && slices.Equal(a.NUMA, b.NUMA) && a.Domain == b.Domain &&
		slices.Equal(a.Drained, b.Drained) && a.Out == b.Out
}

// runToken names one planning run.
type runToken struct{ _ byte }

// slotRange is consecutive worker slots on one node.
type slotRange struct{ first, n int32 }

// nodeNote is a reason recorded against a node, for one component or
// (comp "") the node as a whole.
type nodeNote struct {
	comp   plan.Component
	reason string
}

// nodeState is one node during a run and in the plan it makes: what each
// component holds of each GPU, the CPUs left, the workers it hosts, and
// the reasons recorded against it. A plan's states are read-only; a later
// run shares those of nodes it does not touch and copies the others on
// their first write (engine.mut).
type nodeState struct {
	// owner is the run that may write the state. A token, not the engine:
	// a state that outlives its run must not keep the run (and through it
	// every earlier plan) alive.
	owner *runToken
	node  *Node
	// held is what other plans hold of the node in this run (mark): the
	// node's own, or its remainder's; nil where none hold anything (a
	// pointer: a free cluster's 20,000 states do not pay 32 bytes each).
	held   *mark
	usable []int // healthy GPU indices, ascending; never written
	// shares is what each component holds of each GPU, component by
	// component (shareOf): one list, not one per component, as 20,000
	// states of a run afresh cost 48 bytes each for two more slice
	// headers. A new state's is one zero list of its run's, read-only,
	// until the first worker held here takes its own from arena (hold): a
	// run afresh on 20,000 nodes writes few of them when other plans hold
	// the rest (a shrink's taker), and 3.8 MB of zeros were made for the
	// others. arena nil: the list is the state's own.
	shares  []float64
	arena   *shareArena
	cpuLeft float64
	count   [nComp]int32 // workers of each component here
	// glen is the number of scheduling groups of each component
	// (gcountOf).
	glen [nComp]int32
	// free counts usable GPUs that no component holds and no buffer has
	// reserved.
	free int32
	// firstTrain is the lowest train index here, -1 for none; buffers are
	// numbered in this order.
	firstTrain int32
	// x is what only the nodes a run places on or notes have (nil:
	// none): behind one pointer, so that each of the 20,000 states of a
	// run afresh that places 8 workers costs 120 bytes, not 240.
	x *nodeExtra
}

// nodeExtra is what a state holds beside its shares and counts: the
// buffer's reserved GPUs, the worker slots, the reasons and the
// document entries. Written only through its state's owner.
type nodeExtra struct {
	// gcounts counts the workers here per scheduling group, component by
	// component, glen groups each (gcountOf): one list, as shares is; nil
	// until the first is held.
	gcounts []int32
	// resv marks GPUs reserved in the train range for a buffer that uses
	// CUDA, as rlightning reserves them; nil when none are.
	resv  []bool
	slots []slotRange
	notes []nodeNote
	// doc caches the node's entry in each auto pool of the plan document.
	doc [2]*plan.PoolNode
}

// extraSlab hands out one run's nodeExtras in chunks that double up to
// 1024 (112 bytes each: 14 pages of 8 KiB, none left over): a run afresh on 20,000 nodes gives one
// to each node it places on, a run of 8 workers a few.
type extraSlab struct {
	buf  []nodeExtra
	made int
	// counts hands out the extras' group counts, as buf the extras.
	counts []int32
}

// take is a zero nodeExtra of the slab's.
func (s *extraSlab) take() *nodeExtra {
	if len(s.buf) == 0 {
		s.buf = make([]nodeExtra, min(1024, max(16, s.made)))
		s.made += len(s.buf)
	}
	x := &s.buf[0]
	s.buf = s.buf[1:]
	return x
}

// groupCounts is n zero counts of the slab's.
func (s *extraSlab) groupCounts(n int) []int32 { return carve(&s.counts, n, 1024) }

// carve is the first n values of *buf, zero and capped at n, *buf made
// anew (chunk long, or n) where it holds fewer: many small lists from a
// few allocations.
func carve[T any](buf *[]T, n, chunk int) []T {
	if len(*buf) < n {
		*buf = make([]T, max(n, chunk))
	}
	out := (*buf)[:n:n]
	*buf = (*buf)[n:]
	return out
}

// ext is the state's nodeExtra for writing, taken from s (nil: one of
// its own) where it has none yet.
func (ns *nodeState) ext(s *extraSlab) *nodeExtra {
	if ns.x == nil {
		if s != nil {
			ns.x = s.take()
		} else {
			ns.x = new(nodeExtra)
		}
	}
	return ns.x
}

// resv is the GPUs reserved for a buffer, by index (nil: none).
func (ns *nodeState) resv() []bool {
	if ns.x == nil {
		return nil
	}
	return ns.x.resv
}

// slots is the worker slots on the node.
func (ns *nodeState) slots() []slotRange {
	if ns.x == nil {
		return nil
	}
	return ns.x.slots
}

// notes is the reasons recorded against the node.
func (ns *nodeState) notes() []nodeNote {
	if ns.x == nil {
		return nil
	}
	return ns.x.notes
}

// doc is the node's cached entry in auto pool p (nil: none).
func (ns *nodeState) doc(p int) *plan.PoolNode {
	if ns.x == nil {
		return nil
	}
	return ns.x.doc[p]
}

// mark is what other plans hold here.
func (ns *nodeState) mark() mark {
	if ns.held == nil {
		return mark{}
	}
	return *ns.held
}

// holder is the other plan that holds GPU i, "" when none does.
func (ns *nodeState) holder(i int) string { return ns.mark().holder(i) }

// freeGPU reports whether GPU i may be given this plan's work: healthy
// and held by no other plan.
func (ns *nodeState) freeGPU(i int) bool { return ns.mark().free(ns.node, i) }

// cpusFree is the CPUs this plan may use here (mark.cpusFree).
func (ns *nodeState) cpusFree() float64 { return ns.mark().cpusFree(ns.node) }

// reserve marks GPU g reserved for a buffer.
func (ns *nodeState) reserve(g int, s *extraSlab) {
	x := ns.ext(s)
	if x.resv == nil {
		x.resv = make([]bool, ns.node.GPUs)
	}
	x.resv[g] = true
}

// newStates sets up states for nodes from a few shared slabs: at ten
// thousand nodes, per-node allocations cost more than the planning.
// groups is the number of scheduling groups of each component; marks,
// where set, node i's mark (else its own).
func newStates(nodes []Node, marks []mark, owner *runToken, groups [nComp]int, xs *extraSlab) []*nodeState {
	slab := make([]nodeState, len(nodes))
	widest := 0
	for i := range nodes {
		widest = max(widest, nodes[i].GPUs)
	}
	zero := make([]float64, nComp*widest)
	// A node whose every GPU is usable (a free cluster's, all of them)
	// shares one list 0..widest-1, as usable is never written; only the
	// others get lists of their own, from chunks as they fill, so that a
	// run on a cluster other plans hold (a shrink's taker: none usable
	// on 20,000 nodes) does not set aside 1.3 MB for lists it never makes.
	every := make([]int, widest)
	for g := range every {
		every[g] = g
	}
	var usable []int
	arena := &shareArena{}
	out := make([]*nodeState, len(nodes))
	var own []mark // the nodes' own marks, where they have any
	for i := range nodes {
		n := &nodes[i]
		ns := &slab[i]
		var held *mark
		if marks != nil {
			held = &marks[i]
		} else if len(n.HeldBy) > 0 || n.CPUsHeld != 0 {
			if own == nil {
				own = make([]mark, len(nodes))
			}
			own[i] = markOf(n)
			held = &own[i]
		}
		if held != nil && len(held.heldBy) == 0 && held.cpus == 0 {
			held = nil
		}
		*ns = nodeState{owner: owner, node: n, held: held}
		m := ns.mark()
		ns.cpuLeft, ns.firstTrain = m.cpusFree(n), -1
		if len(n.Unhealthy) == 0 && len(m.heldBy) == 0 && len(n.Drained) == 0 && !n.Out {
			ns.usable = every[:n.GPUs:n.GPUs] // m.usable(n, g) for every g
		} else {
			if cap(usable)-len(usable) < n.GPUs {
				usable = make([]int, 0, max(n.GPUs, 4096))
			}
			start := len(usable)
			for g := 0; g < n.GPUs; g++ {
				if m.usable(n, g) {
					usable = append(usable, g)
				}
			}
			ns.usable = usable[start:len(usable):len(usable)]
		}
		ns.free = int32(len(ns.usable))
		ns.shares = zero[: nComp*n.GPUs : nComp*n.GPUs]
		ns.arena = arena
		for c, k := range groups {
			ns.glen[c] = int32(k)
		}
		if len(n.Unhealthy) > 0 {
			x := ns.ext(xs)
			x.notes = append(x.notes, nodeNote{"", ReasonUnhealthyGPU})
		}
		if len(n.Drained) > 0 || n.Out {
			x := ns.ext(xs)
			x.notes = append(x.notes, nodeNote{"", ReasonDrained})
		}
		out[i] = ns
	}
	return out
}

// shareArena hands out the share lists of one run's new states, in
// chunks, as their first workers are held: written only by that run.
type shareArena struct{ buf []float64 }

// take is n zeros of the arena's own.
func (a *shareArena) take(n int) []float64 { return carve(&a.buf, n, 4096) }

// clone copies the state for owner to write: every slice it writes is its
// own (addSlot extends the last range in place).
func (ns *nodeState) clone(owner *runToken) *nodeState {
	c := *ns
	c.owner = owner
	c.arena = nil
	c.shares = slices.Clone(ns.shares)
	if x := ns.x; x != nil {
		c.x = &nodeExtra{gcounts: slices.Clone(x.gcounts), slots: slices.Clone(x.slots), notes: slices.Clone(x.notes)}
		if x.resv != nil {
			c.x.resv = slices.Clone(x.resv)
		}
	}
	return &c
}

// hold counts one more worker of group gi of component ci here, holding
// frac of each of gpus and cpus CPUs: what the chain reads of a node.
// Its first worker takes the node's group counts from xs.
func (ns *nodeState) hold(ci comp, gi int, gpus []int, frac, cpus float64, xs *extraSlab) {
	if ns.arena != nil && len(gpus) > 0 {
		ns.shares = ns.arena.take(nComp * ns.node.GPUs) // zero, as the list it replaces
		ns.arena = nil
	}
	for _, x := range gpus {
		// free counts the wholly free GPUs: a share of eps or less leaves
		// its GPU wholly free (wholly), so the GPU leaves the count only
		// once a share takes it past that, whichever worker that is and
		// however many tiny ones went before.
		was := ns.wholly(x)
		ns.shareOf(ci)[x] += frac
		if was && !ns.wholly(x) {
			ns.free--
		}
	}
	ns.cpuLeft -= cpus
	ns.count[ci]++
	if x := ns.ext(xs); x.gcounts == nil {
		x.gcounts = xs.groupCounts(int(ns.glen[0] + ns.glen[1] + ns.glen[2]))
	}
	ns.gcountOf(ci)[gi]++
}

// shareOf is what component c holds of each GPU here.
func (ns *nodeState) shareOf(c comp) []float64 {
	n := len(ns.shares) / nComp
	return ns.shares[int(c)*n : (int(c)+1)*n : (int(c)+1)*n]
}

// gcountOf is component c's workers here per scheduling group; nil
// where none was ever held.
func (ns *nodeState) gcountOf(c comp) []int32 {
	if ns.x == nil || ns.x.gcounts == nil {
		return nil
	}
	off := int32(0)
	for k := range c {
		off += ns.glen[k]
	}
	return ns.x.gcounts[off : off+ns.glen[c] : off+ns.glen[c]]
}

// wholly reports whether GPU g is held by no component and reserved for
// no buffer.
func (ns *nodeState) wholly(g int) bool {
	if r := ns.resv(); r != nil && r[g] {
		return false
	}
	for c := range comp(nComp) {
		if ns.shareOf(c)[g] > eps {
			return false
		}
	}
	return true
}

// hosts reports whether the node hosts any worker of the components in
// mask (bit ci).
func (ns *nodeState) hosts(mask uint8) bool {
	for ci := range ns.count {
		if mask&(1<<ci) != 0 && ns.count[ci] > 0 {
			return true
		}
	}
	return false
}

// reserved lists the GPUs reserved for a buffer, ascending.
func (ns *nodeState) reserved() []int {
	var out []int
	for g, r := range ns.resv() {
		if r {
			out = append(out, g)
		}
	}
	return out
}

// note records reason against the node once.
func (ns *nodeState) note(c plan.Component, reason string, s *extraSlab) {
	k := nodeNote{c, reason}
	if !slices.Contains(ns.notes(), k) {
		x := ns.ext(s)
		x.notes = append(x.notes, k)
	}
}

// noted reports whether the node has reason for c already.
func (ns *nodeState) noted(c plan.Component, reason string) bool {
	return slices.Contains(ns.notes(), nodeNote{c, reason})
}

// addSlot records worker slot s on the node.
func (ns *nodeState) addSlot(s int, xs *extraSlab) {
	x := ns.ext(xs)
	if k := len(x.slots) - 1; k >= 0 && int(x.slots[k].first+x.slots[k].n) == s {
		x.slots[k].n++
		return
	}
	x.slots = append(x.slots, slotRange{int32(s), 1})
}

// rankOrder is the order rlightning visits nodes in: most usable GPUs
// first, ties by node id (table is sorted by id). A counting sort: at
// twenty thousand nodes a comparison sort of ids is a visible cost.
func rankOrder(table []*nodeState, src []int32) []int32 {
	most := 0
	for _, at := range src {
		most = max(most, len(table[at].usable))
	}
	counts := make([]int, most+2)
	for _, at := range src {
		counts[most-len(table[at].usable)+1]++
	}
	for i := 1; i < len(counts); i++ {
		counts[i] += counts[i-1]
	}
	out := make([]int32, len(src))
	for _, at := range src {
		k := most - len(table[at].usable)
		out[counts[k]] = at
		counts[k]++
	}
	return out
}
