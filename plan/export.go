package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

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
		ids := k < len(opts.NodeIDs) && opts.NodeIDs[k]
		out = append(out, exportPool(p, ids, opts.Counts, p.IndexString, nil))
	}
	return out
}

// exportPool is Export's entry for pool p; index writes a component's
// index string, and prevIDs, when not nil, is p's node ids already
// listed (read-only, shared).
func exportPool(p Pool, ids bool, counts [3]int, index func(Component) string, prevIDs []string) PoolExport {
	e := PoolExport{Name: p.Name, NumNode: p.Nodes.Len()}
	same := true
	for _, n := range p.Nodes.All() {
		same = same && n.TotalGPUs == p.Nodes.At(0).TotalGPUs
	}
	switch {
	case same && p.Nodes.Len() > 0:
		e.NumGPUs = []int{p.Nodes.At(0).TotalGPUs} // one number, not a list of 15,000 cut to it
	case !same:
		e.NumGPUs = make([]int, p.Nodes.Len())
		for i, n := range p.Nodes.All() {
			e.NumGPUs[i] = n.TotalGPUs
		}
	}
	if len(e.NumGPUs) == 0 {
		e.NumGPUs = []int{0}
	}
	if ids {
		e.NodeIDs = prevIDs
		if e.NodeIDs == nil {
			e.NodeIDs = make([]string, p.Nodes.Len())
			for i, n := range p.Nodes.All() {
				e.NodeIDs[i] = n.NodeID
			}
		}
	}
	for _, c := range GPUComponents {
		if s := index(c); s != "" {
			e.Indices = append(e.Indices, ComponentIndex{c, s})
		}
	}
	for ci, c := range GPUComponents {
		if counts[ci] == 0 {
			continue
		}
		if per := p.WorkerCounts(c, counts[ci]); per != nil {
			e.WorkerCounts = append(e.WorkerCounts, ComponentCounts{c, per})
		}
	}
	return e
}

// ExportAfter is Export's entry for pool p with node_ids as ids and the
// given worker counts, where prevOut is the entry Export made of prev
// (with any options: the index strings do not depend on them), and every
// entry's ranges lie within its node's GPUs (as a plan's pools always
// do). Where p is prev with some entries replaced (the same node and GPU
// count at each of prev's positions) and some appended, the index
// strings are prevOut's with only the replaced and appended entries'
// ranges written again, found in them by GPU offset: a grow of one
// worker in a pool of 15,000 nodes does not write the pool's 120,000
// GPUs again. Entries are told apart by identity: an entry shares its
// allocations and worker counts with prev's only when it is that entry
// (documents are never written in place).
func ExportAfter(prev Pool, prevOut PoolExport, p Pool, ids bool, counts [3]int) PoolExport {
	full := func() PoolExport { return exportPool(p, ids, counts, p.IndexString, nil) }
	if p.Name != prev.Name || prevOut.Name != prev.Name || p.Nodes.Len() < prev.Nodes.Len() || prevOut.NumNode != prev.Nodes.Len() {
		return full()
	}
	// spans are the runs of positions written again, [from, to), with
	// the GPU offset at each end.
	var spans []indexSpan
	off := 0
	for i := range p.Nodes.All() {
		n := p.Nodes.At(i)
		if i < prev.Nodes.Len() {
			o := prev.Nodes.At(i)
			if n.NodeID != o.NodeID || n.TotalGPUs != o.TotalGPUs {
				return full()
			}
		}
		if i >= prev.Nodes.Len() || !sameEntry(n, prev.Nodes.At(i)) {
			if k := len(spans) - 1; k >= 0 && spans[k].to == i {
				spans[k].to, spans[k].offTo = i+1, off+n.TotalGPUs
			} else {
				spans = append(spans, indexSpan{from: i, to: i + 1, offFrom: off, offTo: off + n.TotalGPUs})
			}
		}
		off += n.TotalGPUs
		if 4*len(spans) > p.Nodes.Len()+4 {
			return full() // changed throughout: writing it whole is as cheap
		}
	}
	var prevIDs []string
	if ids && p.Nodes.Len() == prev.Nodes.Len() && prevOut.NodeIDs != nil {
		prevIDs = prevOut.NodeIDs // the same ids, checked above
	}
	index := func(c Component) string {
		was := ""
		for _, x := range prevOut.Indices {
			if x.Component == c {
				was = x.Index
			}
		}
		return spliceIndex(was, p, c, spans)
	}
	return exportPool(p, ids, counts, index, prevIDs)
}

// indexSpan is a run of pool positions whose ranges an index string
// writes again, and their GPU offsets.
type indexSpan struct{ from, to, offFrom, offTo int }

// sameEntry reports whether a is the very entry b, as far as Export reads
// it: the same node, GPUs, allocations map and worker counts.
func sameEntry(a, b *PoolNode) bool {
	return a.NodeID == b.NodeID && a.TotalGPUs == b.TotalGPUs && a.Allocations != nil &&
		reflect.ValueOf(a.Allocations).UnsafePointer() == reflect.ValueOf(b.Allocations).UnsafePointer() &&
		sameInts(a.WorkerCounts.Train, b.WorkerCounts.Train) && sameInts(a.WorkerCounts.Eval, b.WorkerCounts.Eval) &&
		sameInts(a.WorkerCounts.Env, b.WorkerCounts.Env)
}

// sameInts reports whether a and b are one slice (or both empty).
func sameInts(a, b []int) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// spliceIndex is p's index string of c, given was, that of the pool it
// differs from only in spans: was's ranges outside them are kept as
// written, the spans' written from p.
func spliceIndex(was string, p Pool, c Component, spans []indexSpan) string {
	if len(spans) == 0 {
		return was
	}
	var b strings.Builder
	b.Grow(len(was) + 64)
	var num [20]byte
	add := func(piece string) {
		if piece == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(piece)
	}
	pos := 0
	for _, sp := range spans {
		lo := indexCut(was, sp.offFrom)
		add(strings.TrimSuffix(was[pos:lo], ", "))
		off := sp.offFrom
		for i := sp.from; i < sp.to; i++ {
			for _, r := range p.Nodes.At(i).Allocations[c] {
				if b.Len() > 0 {
					b.WriteString(", ")
				}
				b.Write(strconv.AppendInt(num[:0], int64(r.First+off), 10))
				if r.Last != r.First {
					b.WriteByte('-')
					b.Write(strconv.AppendInt(num[:0], int64(r.Last+off), 10))
				}
			}
			off += p.Nodes.At(i).TotalGPUs
		}
		pos = max(lo, indexCut(was, sp.offTo))
	}
	add(was[pos:])
	return b.String()
}

// indexCut is the byte position in index string s of its first range
// that begins at GPU x or beyond, len(s) if none: s lists its ranges in
// pool order, and each node's lie within its GPUs, so those of the nodes
// before x's come first.
func indexCut(s string, x int) int {
	// next is the first range's start at or after byte i.
	next := func(i int) int {
		if i == 0 {
			return 0
		}
		from := max(i-2, 0)
		if k := strings.Index(s[from:], ", "); k >= 0 {
			return from + k + 2
		}
		return len(s)
	}
	at := sort.Search(len(s)+1, func(i int) bool {
		t := next(i)
		return t == len(s) || firstOf(s[t:]) >= x
	})
	return next(at)
}

// firstOf is the number s begins with.
func firstOf(s string) int {
	n := 0
	for i := 0; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		n = 10*n + int(s[i]-'0')
	}
	return n
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
