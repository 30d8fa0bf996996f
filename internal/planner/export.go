package planner

import (
	"bytes"
	"encoding/json"

	"strconv"

	"go.yaml.in/yaml/v3"
)

// PoolExport is one entry of rlightning's resource_pool list
// (to_yaml_config), loadable back in manual mode.
type PoolExport struct {
	Name    string
	NumNode int
	// NumGPUs has one value when all nodes are alike, else one per node.
	NumGPUs []int
	// NodeIDs is set when loading without it would pick other nodes.
	NodeIDs []string
	// Indices are the pool-global index strings, in component order.
	Indices []ComponentIndex
	// WorkerCounts is poolplanner's addition to rlightning's format: per
	// component, how many of its workers go on each node of the pool, per
	// scheduling group (worker_counts: {env: [16, 0]}, or [[16, 0], [0, 4]]
	// for two env groups). It is written where rlightning's packing of the
	// index strings would place the workers otherwise (workers without
	// GPUs, incremental plans), and manual mode places by it.
	WorkerCounts []ComponentCounts
}

// ComponentCounts is one component's counts per pool node and group.
type ComponentCounts struct {
	Component Component
	PerNode   [][]int
}

// value is the counts as written: a count per node for one group, else a
// list per node.
func (cc ComponentCounts) value() any {
	flat := make([]int, len(cc.PerNode))
	for i, g := range cc.PerNode {
		if len(g) != 1 {
			return cc.PerNode
		}
		flat[i] = g[0]
	}
	return flat
}

// ComponentIndex is one component's pool-global index string.
type ComponentIndex struct {
	Component Component
	Index     string
}

func (p PoolExport) numGPUs() any {
	if len(p.NumGPUs) == 1 {
		return p.NumGPUs[0]
	}
	return p.NumGPUs
}

// MarshalJSON writes the pool with rlightning's keys in rlightning's order.
func (p PoolExport) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"name":`)
	name, _ := json.Marshal(p.Name)
	buf.Write(name)
	buf.WriteString(`,"num_node":` + strconv.Itoa(p.NumNode) + `,"num_gpus":`)
	g, _ := json.Marshal(p.numGPUs())
	buf.Write(g)
	if p.NodeIDs != nil {
		ids, _ := json.Marshal(p.NodeIDs)
		buf.WriteString(`,"node_ids":`)
		buf.Write(ids)
	}
	for _, ci := range p.Indices {
		s, _ := json.Marshal(ci.Index)
		buf.WriteString(`,"` + string(ci.Component) + `":`)
		buf.Write(s)
	}
	if len(p.WorkerCounts) > 0 {
		buf.WriteString(`,"worker_counts":{`)
		for i, cc := range p.WorkerCounts {
			if i > 0 {
				buf.WriteByte(',')
			}
			counts, _ := json.Marshal(cc.value())
			buf.WriteString(`"` + string(cc.Component) + `":`)
			buf.Write(counts)
		}
		buf.WriteByte('}')
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// MarshalYAML writes the same keys as MarshalJSON, in a block mapping.
func (p PoolExport) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v any) {
		var val yaml.Node
		_ = val.Encode(v)
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &val)
	}
	add("name", p.Name)
	add("num_node", p.NumNode)
	add("num_gpus", p.numGPUs())
	if p.NodeIDs != nil {
		add("node_ids", p.NodeIDs)
		n.Content[len(n.Content)-1].Style = yaml.FlowStyle
	}
	if len(p.NumGPUs) > 1 {
		n.Content[5].Style = yaml.FlowStyle
	}
	for _, ci := range p.Indices {
		add(string(ci.Component), ci.Index)
		n.Content[len(n.Content)-1].Style = yaml.DoubleQuotedStyle
	}
	if len(p.WorkerCounts) > 0 {
		cw := &yaml.Node{Kind: yaml.MappingNode}
		for _, cc := range p.WorkerCounts {
			var counts yaml.Node
			_ = counts.Encode(cc.value())
			counts.Style = yaml.FlowStyle
			cw.Content = append(cw.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: string(cc.Component)}, &counts)
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "worker_counts"}, cw)
	}
	return n, nil
}

// ResourcePoolYAML is the plan as rlightning's `resource_pool:` list.
func (p *Plan) ResourcePoolYAML() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	list := p.ResourcePool
	if list == nil {
		list = []PoolExport{}
	}
	if err := enc.Encode(map[string]any{"resource_pool": list}); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// exportPools writes pools as rlightning's list, from the pool API (index
// strings as Pool.IndexString writes them). node_ids (and num_gpus per
// node) are added wherever loading the list without them would pick other
// nodes, and worker_counts for the components in counts (with their
// groups' number), so that loading the export reproduces the plan; order
// holds each pool's node positions in table, which is sorted by node id.
func exportPools(pools []Pool, order [][]int32, table []*nodeState, counts [nComp]int) []PoolExport {
	mixed := false
	for _, ns := range table {
		mixed = mixed || ns.node.GPUs != table[0].node.GPUs
	}
	used := make([]bool, len(table))
	out := make([]PoolExport, 0, len(pools))
	for k, p := range pools {
		e := PoolExport{Name: p.Name, NumNode: len(p.Nodes)}
		same := true
		for _, n := range p.Nodes {
			e.NumGPUs = append(e.NumGPUs, n.TotalGPUs)
			same = same && n.TotalGPUs == p.Nodes[0].TotalGPUs
		}
		if same && len(e.NumGPUs) > 0 {
			e.NumGPUs = e.NumGPUs[:1]
		}
		if len(e.NumGPUs) == 0 {
			e.NumGPUs = []int{0}
		}
		// Which nodes would rlightning pick without node_ids? The first
		// ones by id that no earlier pool took.
		needIDs := mixed || !same
		next := 0
		for _, at := range order[k] {
			for next < len(used) && used[next] {
				next++
			}
			needIDs = needIDs || int(at) != next
			next++
		}
		for _, at := range order[k] {
			used[at] = true
		}
		if needIDs {
			e.NodeIDs = make([]string, len(p.Nodes))
			for i, n := range p.Nodes {
				e.NodeIDs[i] = n.NodeID
			}
		}
		for _, c := range gpuComponents {
			if s := p.IndexString(c); s != "" {
				e.Indices = append(e.Indices, ComponentIndex{c, s})
			}
		}
		for ci, c := range gpuComponents {
			if counts[ci] == 0 {
				continue
			}
			if per := p.WorkerCounts(c, counts[ci]); per != nil {
				e.WorkerCounts = append(e.WorkerCounts, ComponentCounts{c, per})
			}
		}
		out = append(out, e)
	}
	return out
}

// UnmarshalJSON reads what MarshalJSON writes, so plan documents read back
// from the bus keep their resource_pool.
func (p *PoolExport) UnmarshalJSON(b []byte) error {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	pc, err := parsePool("resource_pool", jsonNumbersToInts(raw))
	if err != nil {
		return err
	}
	*p = PoolExport{Name: pc.Name, NumNode: pc.NumNode, NumGPUs: pc.NumGPUs, NodeIDs: pc.NodeIDs}
	for _, c := range gpuComponents {
		if s, ok := raw[string(c)].(string); ok && s != "" {
			p.Indices = append(p.Indices, ComponentIndex{c, s})
		}
		if counts := pc.WorkerCounts[c]; counts != nil {
			p.WorkerCounts = append(p.WorkerCounts, ComponentCounts{c, counts})
		}
	}
	return nil
}

// jsonNumbersToInts turns the whole float64s encoding/json produces into
// ints, as the YAML reader the spec parser expects gives them.
func jsonNumbersToInts(v any) any {
	switch x := v.(type) {
	case float64:
		if x == float64(int(x)) {
			return int(x)
		}
	case []any:
		for i := range x {
			x[i] = jsonNumbersToInts(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = jsonNumbersToInts(x[k])
		}
	}
	return v
}
