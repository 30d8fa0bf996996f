package planner

import (
	"sort"
)

// eps absorbs float error when fractional shares are summed (0.1 * 10).
const eps = 1e-9

// Node is what the planner knows of one machine.
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
}

// Healthy reports whether GPU i may be given work.
func (n *Node) Healthy(i int) bool {
	for _, u := range n.Unhealthy {
		if u == i {
			return false
		}
	}
	return true
}

// UsableGPUs is the number of healthy GPUs.
func (n *Node) UsableGPUs() int {
	c := 0
	for i := 0; i < n.GPUs; i++ {
		if n.Healthy(i) {
			c++
		}
	}
	return c
}

// nodeState is a node during one planning run: which GPUs are still free
// (a cursor over the healthy ones, as rlightning's gpu_cursor), the CPUs
// left, and how much of each GPU each component holds.
type nodeState struct {
	node     *Node
	usable   []int
	cursor   int
	cpuLeft  float64
	share    [len(gpuComponents)][]float64
	hasTrain bool
	// pools[i] is this node's entry in the run's i-th pool, if any.
	pools []*poolNodeBuild
}

func newNodeState(n *Node) *nodeState {
	ns := &nodeState{}
	initNodeState(ns, n, make([]int, 0, n.GPUs))
	return ns
}

// newNodeStates sets up every node from a few shared slabs: at ten
// thousand nodes, per-node allocations cost more than the planning.
func newNodeStates(nodes []Node) []*nodeState {
	total := 0
	for i := range nodes {
		total += nodes[i].GPUs
	}
	slab := make([]nodeState, len(nodes))
	gpus := make([]int, 0, total)
	shares := make([]float64, len(gpuComponents)*total)
	out := make([]*nodeState, len(nodes))
	off := 0 // into shares: every GPU has a slot, healthy or not
	for i := range nodes {
		ns := &slab[i]
		start := len(gpus)
		initNodeState(ns, &nodes[i], gpus[start:start:start+nodes[i].GPUs])
		gpus = gpus[:start+len(ns.usable)]
		for c := range ns.share {
			at := c*total + off
			ns.share[c] = shares[at : at+nodes[i].GPUs : at+nodes[i].GPUs]
		}
		off += nodes[i].GPUs
		out[i] = ns
	}
	return out
}

func initNodeState(ns *nodeState, n *Node, usable []int) {
	ns.node, ns.cpuLeft = n, n.CPUs
	ns.usable = usable
	for i := 0; i < n.GPUs; i++ {
		if len(n.Unhealthy) == 0 || n.Healthy(i) {
			ns.usable = append(ns.usable, i)
		}
	}
}

// free is the healthy GPUs at and after the cursor.
func (ns *nodeState) free() []int { return ns.usable[ns.cursor:] }

func (ns *nodeState) shares(c int) []float64 {
	if ns.share[c] == nil {
		ns.share[c] = make([]float64, ns.node.GPUs)
	}
	return ns.share[c]
}

// sortNodes orders nodes as rlightning visits them: most GPUs first, ties
// by node id. Usable GPUs count, so a node with a dead GPU ranks as smaller.
func sortNodes(states []*nodeState) {
	sort.SliceStable(states, func(i, j int) bool {
		a, b := len(states[i].usable), len(states[j].usable)
		if a != b {
			return a > b
		}
		return states[i].node.ID < states[j].node.ID
	})
}
