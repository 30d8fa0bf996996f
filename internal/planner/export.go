package planner

import (
	"bytes"
	"encoding/json"
	"sort"
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

// exportPools writes pools as rlightning's list. node_ids (and num_gpus
// per node) are added wherever loading the list without them would pick
// other nodes, so that loading the export reproduces the plan.
func exportPools(pools []Pool, nodes []Node) []PoolExport {
	sorted := make([]string, len(nodes))
	mixed := false
	for i := range nodes {
		sorted[i] = nodes[i].ID
		mixed = mixed || nodes[i].GPUs != nodes[0].GPUs
	}
	sort.Strings(sorted)
	used := map[string]bool{}
	out := make([]PoolExport, 0, len(pools))
	for _, p := range pools {
		e := PoolExport{Name: p.Name, NumNode: len(p.Nodes)}
		same := true
		for i, n := range p.Nodes {
			e.NumGPUs = append(e.NumGPUs, n.TotalGPUs)
			same = same && n.TotalGPUs == p.Nodes[0].TotalGPUs
			_ = i
		}
		if same && len(e.NumGPUs) > 0 {
			e.NumGPUs = e.NumGPUs[:1]
		}
		if len(e.NumGPUs) == 0 {
			e.NumGPUs = []int{0}
		}
		// Which nodes would rlightning pick without node_ids?
		needIDs := mixed || !same
		if !needIDs {
			k := 0
			for _, id := range sorted {
				if k == len(p.Nodes) {
					break
				}
				if used[id] {
					continue
				}
				if id != p.Nodes[k].NodeID {
					needIDs = true
					break
				}
				k++
			}
			needIDs = needIDs || k < len(p.Nodes)
		}
		ids := make([]string, len(p.Nodes))
		for i, n := range p.Nodes {
			ids[i] = n.NodeID
			used[n.NodeID] = true
		}
		if needIDs {
			e.NodeIDs = ids
		}
		for _, c := range gpuComponents {
			var b []byte
			off := 0
			for _, n := range p.Nodes {
				for _, r := range n.Allocations[c] {
					if len(b) > 0 {
						b = append(b, ", "...)
					}
					b = strconv.AppendInt(b, int64(r.First+off), 10)
					if r.Last != r.First {
						b = append(b, '-')
						b = strconv.AppendInt(b, int64(r.Last+off), 10)
					}
				}
				off += n.TotalGPUs
			}
			if len(b) > 0 {
				e.Indices = append(e.Indices, ComponentIndex{c, string(b)})
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
