package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
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
func (p *Document) ResourcePoolYAML() ([]byte, error) {
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

// MaxGroups bounds the scheduling groups of one component an export's
// worker_counts may list (a spec has one per env entry).
const MaxGroups = 4096

// ExportOptions say what rlightning's list needs beyond the pools.
type ExportOptions struct {
	// NodeIDs says, per pool, whether it lists node_ids: where loading the
	// list without them would pick other nodes, which depends on the whole
	// inventory (the planner knows).
	NodeIDs []bool `json:"node_ids"`
	// Counts is, per component of GPUComponents, the number of its
	// scheduling groups if the list gives its worker_counts, else 0.
	Counts [3]int `json:"worker_counts"`
}

// Export writes pools as rlightning's resource_pool list, from the pool
// API: per pool its name, node count, GPUs per node (one number when all
// are alike), node_ids where opts says, each component's pool-global index
// string, and worker_counts for the components opts names.
func Export(pools []Pool, opts ExportOptions) []PoolExport {
	out := make([]PoolExport, 0, len(pools))
	for k, p := range pools {
		e := PoolExport{Name: p.Name, NumNode: len(p.Nodes)}
		same := true
		for _, n := range p.Nodes {
			same = same && n.TotalGPUs == p.Nodes[0].TotalGPUs
		}
		switch {
		case same && len(p.Nodes) > 0:
			e.NumGPUs = []int{p.Nodes[0].TotalGPUs} // one number, not a list of 15,000 cut to it
		case !same:
			e.NumGPUs = make([]int, len(p.Nodes))
			for i, n := range p.Nodes {
				e.NumGPUs[i] = n.TotalGPUs
			}
		}
		if len(e.NumGPUs) == 0 {
			e.NumGPUs = []int{0}
		}
		if k < len(opts.NodeIDs) && opts.NodeIDs[k] {
			e.NodeIDs = make([]string, len(p.Nodes))
			for i, n := range p.Nodes {
				e.NodeIDs[i] = n.NodeID
			}
		}
		for _, c := range GPUComponents {
			if s := p.IndexString(c); s != "" {
				e.Indices = append(e.Indices, ComponentIndex{c, s})
			}
		}
		for ci, c := range GPUComponents {
			if opts.Counts[ci] == 0 {
				continue
			}
			if per := p.WorkerCounts(c, opts.Counts[ci]); per != nil {
				e.WorkerCounts = append(e.WorkerCounts, ComponentCounts{c, per})
			}
		}
		out = append(out, e)
	}
	return out
}

// UnmarshalJSON reads what MarshalJSON writes, so plan documents read back
// from the bus keep their resource_pool. It reads; checking a list a
// person wrote is the spec parser's job.
func (p *PoolExport) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*p = PoolExport{}
	var numGPUs any
	var counts map[string]json.RawMessage
	for _, f := range []struct {
		key string
		dst any
	}{{"name", &p.Name}, {"num_node", &p.NumNode}, {"num_gpus", &numGPUs}, {"node_ids", &p.NodeIDs}, {"worker_counts", &counts}} {
		if v, ok := raw[f.key]; ok {
			if err := json.Unmarshal(v, f.dst); err != nil {
				return fmt.Errorf("resource_pool.%s: %w", f.key, err)
			}
		}
	}
	switch g := numGPUs.(type) {
	case float64:
		p.NumGPUs = []int{int(g)}
	case []any:
		for _, x := range g {
			n, _ := x.(float64)
			p.NumGPUs = append(p.NumGPUs, int(n))
		}
	}
	for _, c := range GPUComponents {
		var s string
		if v, ok := raw[string(c)]; ok && json.Unmarshal(v, &s) == nil && s != "" {
			p.Indices = append(p.Indices, ComponentIndex{c, s})
		}
		v, ok := counts[string(c)]
		if !ok {
			continue
		}
		cc := ComponentCounts{Component: c}
		var flat []int
		if json.Unmarshal(v, &flat) == nil {
			for _, k := range flat {
				cc.PerNode = append(cc.PerNode, []int{k})
			}
		} else if err := json.Unmarshal(v, &cc.PerNode); err != nil {
			return fmt.Errorf("resource_pool.worker_counts.%s: %w", c, err)
		}
		p.WorkerCounts = append(p.WorkerCounts, cc)
	}
	return nil
}
