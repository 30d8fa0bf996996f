package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// rayResources is one node of rlightning's (Ray's) cluster info.
type rayResources struct {
	IP  string   `json:"ip"`
	CPU *float64 `json:"CPU"`
	GPU *float64 `json:"GPU"`
}

// ParseNodes reads an inventory file: rlightning's cluster info
// {"node_id_to_resources": {...}} or a JSON list of NodeInventory
// documents, and returns the nodes the planner sees. Node ids follow
// NodeIDRule; documents must Validate (every GPU has a UUID) and no two
// of them list one GPU UUID. Cluster info names no GPU: its nodes'
// GPUs have no UUIDs (the planner knows them by node and index, and a
// plan from it has no gpu_uuids), so neither UUID rule concerns them.
func ParseNodes(data []byte) ([]planner.Node, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("inventory is empty; want {\"node_id_to_resources\": {...}} or a list of NodeInventory documents")
	}
	if trimmed[0] == '[' {
		var docs []NodeInventory
		if err := json.Unmarshal(trimmed, &docs); err != nil {
			return nil, fmt.Errorf("inventory is not a valid list of NodeInventory documents: %w", err)
		}
		nodes := make([]planner.Node, 0, len(docs))
		seen := make(map[string]bool, len(docs))
		var claims Claims
		for i, d := range docs {
			if err := d.Validate(); err != nil {
				return nil, fmt.Errorf("inventory[%d].%w", i, err)
			}
			if seen[d.NodeID] {
				return nil, fmt.Errorf("inventory[%d].node_id: %q appears twice", i, d.NodeID)
			}
			seen[d.NodeID] = true
			// One GPU, one node. The service marks a later claimant's GPU
			// unusable (Claims), since it cannot refuse the cluster for one
			// reporter's document; a file has no order of arrival, and its
			// author can fix it, so here it is an error.
			if r := claims.Put(d.NodeID, d).Refused; len(r) > 0 {
				return nil, fmt.Errorf("inventory[%d].gpus: GPU %d's uuid %q is node %s's too, listed before; a GPU belongs to one node",
					i, r[0].Index, r[0].UUID, r[0].Holder)
			}
			n, err := d.PlannerNode()
			if err != nil {
				return nil, fmt.Errorf("inventory[%d]: %w", i, err)
			}
			nodes = append(nodes, n)
		}
		return nodes, nil
	}
	var ray struct {
		Nodes map[string]rayResources `json:"node_id_to_resources"`
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&ray); err != nil {
		return nil, fmt.Errorf("inventory is not valid JSON cluster info: %w", err)
	}
	if ray.Nodes == nil {
		return nil, fmt.Errorf("inventory.node_id_to_resources: missing; want {\"node_id_to_resources\": {\"<node_id>\": {\"ip\": ..., \"CPU\": ..., \"GPU\": ...}}}")
	}
	ids := make([]string, 0, len(ray.Nodes))
	for id := range ray.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	nodes := make([]planner.Node, 0, len(ids))
	for _, id := range ids {
		if err := ValidateNodeID(id); err != nil {
			return nil, fmt.Errorf("inventory.node_id_to_resources: %w", err)
		}
		r := ray.Nodes[id]
		field := "inventory.node_id_to_resources." + id
		gpus, cpus := 0.0, 0.0
		if r.GPU != nil {
			gpus = *r.GPU
		}
		if r.CPU != nil {
			cpus = *r.CPU
		}
		if gpus < 0 || gpus != math.Trunc(gpus) || gpus > planner.MaxNodeGPUs {
			return nil, fmt.Errorf("%s.GPU: %v is not allowed; want a whole number from 0 to %d", field, gpus, planner.MaxNodeGPUs)
		}
		if !(cpus >= 0) || cpus > planner.MaxCPUs {
			return nil, fmt.Errorf("%s.CPU: %v is not allowed; want a number from 0 to %d", field, cpus, int(planner.MaxCPUs))
		}
		nodes = append(nodes, planner.Node{ID: id, IP: r.IP, CPUs: cpus, GPUs: int(gpus)})
	}
	return nodes, nil
}

// PlannerNode is the node as the planner sees it: GPU indices must be
// 0..n-1, and unhealthy GPUs are listed so no work lands on them.
func (n NodeInventory) PlannerNode() (planner.Node, error) {
	node := planner.Node{ID: n.NodeID, IP: n.IP, CPUs: float64(n.CPUs), GPUs: len(n.GPUs)}
	if n.CPUs < 0 || float64(n.CPUs) > planner.MaxCPUs {
		return node, fmt.Errorf("cpus: %d is not allowed; want 0 to %d", n.CPUs, int(planner.MaxCPUs))
	}
	if len(n.GPUs) > planner.MaxNodeGPUs {
		return node, fmt.Errorf("gpus: %d GPUs is not allowed; want at most %d", len(n.GPUs), planner.MaxNodeGPUs)
	}
	uuids := make([]string, len(n.GPUs))
	seen := make([]bool, len(n.GPUs))
	node.Models, node.MemoryBytes, node.Labels = make([]string, len(n.GPUs)), make([]uint64, len(n.GPUs)), n.Labels
	node.Peers, node.NUMA, node.Domain = make([]uint64, len(n.GPUs)), make([]int, len(n.GPUs)), n.Domain()
	for i, g := range n.GPUs {
		if g.Index < 0 || g.Index >= len(n.GPUs) || seen[g.Index] {
			return node, fmt.Errorf("gpus[%d].index: %d is not allowed; want distinct indices 0..%d", i, g.Index, len(n.GPUs)-1)
		}
		seen[g.Index] = true
		uuids[g.Index] = g.UUID
		node.Models[g.Index], node.MemoryBytes[g.Index], node.NUMA[g.Index] = g.Name, g.MemoryBytes, -1
		if g.NUMANode != nil {
			node.NUMA[g.Index] = *g.NUMANode
		}
		for _, p := range g.NVLinkPeers {
			if p >= 0 && p < len(n.GPUs) && p < 64 {
				node.Peers[g.Index] |= 1 << p
			}
		}
		if !g.Healthy {
			node.Unhealthy = append(node.Unhealthy, g.Index)
		}
	}
	sort.Ints(node.Unhealthy)
	node.GPUUUIDs = uuids
	return node, nil
}
