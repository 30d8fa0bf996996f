package planner

import (
	"fmt"
	"sort"
)

// ErrMixedNodesNeedIDs is rlightning's message for a manual pool without
// node_ids on a cluster whose nodes differ in GPU count.
const ErrMixedNodesNeedIDs = "Manual mode without specified node_ids requires per-node num_gpus to be a single value."

// manual loads the spec's resource pools as rlightning does and packs the
// workers into them. Unlike rlightning it refuses pools that leave a
// component's workers without GPUs.
func (b *build) manual() error {
	if err := b.loadPools(); err != nil {
		return err
	}
	for ci, d := range b.demands {
		if gpusNeeded(d.groups) == 0 {
			continue
		}
		given := false
		for _, p := range b.pools {
			for _, pn := range p.nodes {
				given = given || len(pn.alloc[ci]) > 0
			}
		}
		if !given {
			return &PlanError{fmt.Sprintf("Cannot place %s: %d workers, but no resource pool gives %s any GPUs", d.comp, d.total, d.comp)}
		}
	}
	for _, p := range b.pools {
		for _, pn := range p.nodes {
			for ci, d := range b.demands {
				if len(pn.alloc[ci]) == 0 || d.done() {
					continue
				}
				gpus := make([]int, 0, len(pn.alloc[ci]))
				for _, g := range pn.alloc[ci] {
					if pn.ns.node.Healthy(g) {
						gpus = append(gpus, g)
					}
				}
				b.pk.fill(p.name, pn.ns, d, gpus)
			}
		}
	}
	return nil
}

// loadPools reads rlightning's resource_pool list: each pool's nodes are
// its node_ids or, without them, the first nodes by id that no earlier
// pool took; index strings are pool-global, each node offset by the GPUs
// of the nodes before it.
func (b *build) loadPools() error {
	ids := make([]string, 0, len(b.states))
	mixed := false
	for _, ns := range b.states {
		ids = append(ids, ns.node.ID)
		mixed = mixed || ns.node.GPUs != b.states[0].node.GPUs
	}
	sort.Strings(ids)
	used := map[string]bool{}
	for i, pc := range b.spec.ResourcePool {
		field := fmt.Sprintf("resource_pool[%d]", i)
		var nodes []string
		if pc.NodeIDs != nil {
			nodes = pc.NodeIDs
			for j, id := range nodes {
				if b.byID[id] == nil {
					return fieldErr(fmt.Sprintf("%s.node_ids[%d]", field, j), "node %q is not in the inventory", id)
				}
			}
		} else {
			if mixed || pc.NumGPUsList {
				return &PlanError{ErrMixedNodesNeedIDs}
			}
			for _, id := range ids {
				if len(nodes) == pc.NumNode {
					break
				}
				if !used[id] {
					nodes = append(nodes, id)
				}
			}
			if len(nodes) < pc.NumNode {
				return &PlanError{fmt.Sprintf("Not enough nodes for resource pool %q: num_node is %d, %d unused nodes left", pc.Name, pc.NumNode, len(nodes))}
			}
		}
		p := b.pool(pc.Name)
		offsets := make([]int, len(nodes)+1)
		for j, id := range nodes {
			used[id] = true
			n := b.byID[id].node
			want := pc.NumGPUs[0]
			if pc.NumGPUsList {
				want = pc.NumGPUs[j]
			}
			if want != n.GPUs {
				return fieldErr(field+".num_gpus", "says %d GPUs for node %s, which has %d", want, id, n.GPUs)
			}
			offsets[j+1] = offsets[j] + n.GPUs
			p.node(b.byID[id])
		}
		for ci, c := range gpuComponents {
			for _, r := range pc.Ranges[c] {
				if r.Last >= offsets[len(nodes)] {
					return fieldErr(field+"."+string(c), "index %d is beyond the pool's %d GPUs (0-%d)", r.Last, offsets[len(nodes)], offsets[len(nodes)]-1)
				}
				for j := range nodes {
					lo, hi := max(r.First, offsets[j]), min(r.Last, offsets[j+1]-1)
					for g := lo; g <= hi; g++ {
						pn := p.nodes[j]
						pn.alloc[ci] = append(pn.alloc[ci], g-offsets[j])
					}
				}
			}
		}
	}
	return nil
}
