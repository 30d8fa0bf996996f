package planner

import (
	"fmt"
	"sort"
	"strings"
)

// Clone returns a deep copy of the node.
func (n Node) Clone() Node {
	n.Unhealthy = append([]int(nil), n.Unhealthy...)
	n.GPUUUIDs = append([]string(nil), n.GPUUUIDs...)
	return n
}

// AvailableGPUs is how many healthy GPUs of the node no component of the
// pool node holds.
func (pn PoolNode) AvailableGPUs(n *Node) int {
	held := map[int]bool{}
	for _, rs := range pn.Allocations {
		for _, r := range rs {
			for g := r.First; g <= r.Last; g++ {
				held[g] = true
			}
		}
	}
	free := 0
	for g := 0; g < n.GPUs; g++ {
		if !held[g] && n.Healthy(g) {
			free++
		}
	}
	return free
}

// ComponentTypes are the components with GPUs in the pool, in planning
// order, with buffer added wherever train is (buffers sit with train).
func (p Pool) ComponentTypes() []Component {
	has := map[Component]bool{}
	for _, n := range p.Nodes {
		for c := range n.Allocations {
			has[c] = true
		}
	}
	var out []Component
	for _, c := range []Component{Train, Buffer, Eval, Env} {
		if has[c] || (c == Buffer && has[Train]) {
			out = append(out, c)
		}
	}
	return out
}

// TotalGPUs is the GPUs of the pool's nodes.
func (p Pool) TotalGPUs() int {
	t := 0
	for _, n := range p.Nodes {
		t += n.TotalGPUs
	}
	return t
}

// IndexString is the component's GPUs in the pool-global index space:
// nodes concatenated in pool order, each offset by the GPUs of the nodes
// before it, never merged across nodes ("0-7, 8-11").
func (p Pool) IndexString(c Component) string {
	var parts []string
	off := 0
	for _, n := range p.Nodes {
		for _, r := range n.Allocations[c] {
			parts = append(parts, Range{r.First + off, r.Last + off}.String())
		}
		off += n.TotalGPUs
	}
	return strings.Join(parts, ", ")
}

// NodeCount is how many of the pool's nodes hold GPUs of the component.
func (p Pool) NodeCount(c Component) int {
	k := 0
	for _, n := range p.Nodes {
		if len(n.Allocations[c]) > 0 {
			k++
		}
	}
	return k
}

// Dict is the pool's full dictionary form: name, num_node, num_gpus and
// per component its index string and node count.
func (p Pool) Dict() map[string]any {
	d := map[string]any{"name": p.Name, "num_node": len(p.Nodes), "num_gpus": p.TotalGPUs()}
	for _, c := range p.ComponentTypes() {
		if c == Buffer {
			continue
		}
		d[string(c)] = p.IndexString(c)
		d[string(c)+"_num_node"] = p.NodeCount(c)
	}
	return d
}

// ComponentAllocation is one component's GPUs across the plan.
type ComponentAllocation struct {
	Component Component
	// Nodes maps node id to its node-local ranges.
	Nodes map[string][]Range
	// Order is the node ids in pool order.
	Order   []string
	Workers int
}

// Allocation collects component c's GPUs over all pools.
func (p *Plan) Allocation(c Component) ComponentAllocation {
	a := ComponentAllocation{Component: c, Nodes: map[string][]Range{}}
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes {
			if rs := n.Allocations[c]; len(rs) > 0 {
				if _, ok := a.Nodes[n.NodeID]; !ok {
					a.Order = append(a.Order, n.NodeID)
				}
				a.Nodes[n.NodeID] = append(a.Nodes[n.NodeID], rs...)
			}
		}
	}
	for _, w := range p.Workers {
		if w.Component == c {
			a.Workers++
		}
	}
	return a
}

// TotalGPUs is the number of GPUs the component holds.
func (a ComponentAllocation) TotalGPUs() int {
	t := 0
	for _, rs := range a.Nodes {
		for _, r := range rs {
			t += r.Len()
		}
	}
	return t
}

// IndexString is the node-local ranges of every node, in pool order,
// joined by ", " as rlightning writes them.
func (a ComponentAllocation) IndexString() string {
	var parts []string
	for _, id := range a.Order {
		parts = append(parts, FormatRanges(a.Nodes[id]))
	}
	return strings.Join(parts, ", ")
}

// NodeIndexString is the component's ranges on one node ("" if none).
func (a ComponentAllocation) NodeIndexString(node string) string {
	return FormatRanges(a.Nodes[node])
}

// Summary is a short account of the plan: one line per pool and component.
func (p *Plan) Summary() string {
	var b strings.Builder
	if !p.Valid {
		fmt.Fprintf(&b, "invalid: %s\n", p.Error)
	}
	for _, pl := range p.Pools {
		fmt.Fprintf(&b, "%s: %d nodes, %d GPUs\n", pl.Name, len(pl.Nodes), pl.TotalGPUs())
		for _, c := range pl.ComponentTypes() {
			if c != Buffer {
				fmt.Fprintf(&b, "  %s: %q on %d nodes\n", c, pl.IndexString(c), pl.NodeCount(c))
			}
		}
	}
	counts := map[Component]int{}
	for _, w := range p.Workers {
		counts[w.Component]++
	}
	keys := make([]string, 0, len(counts))
	for c := range counts {
		keys = append(keys, string(c))
	}
	sort.Strings(keys)
	for _, c := range keys {
		fmt.Fprintf(&b, "%s workers: %d\n", c, counts[Component(c)])
	}
	return b.String()
}
