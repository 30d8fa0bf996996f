package plan

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// Event is one revision of a plan as its subject carries it: the header,
// and the placement in one of three forms. Whole (small plans and invalid
// ones), when the event reads exactly as the plan document; as the change
// from the revision before; or stored whole as an object, a snapshot
// (the event then carries the change too when it is small, so that a
// follower need not fetch the object).
type Event struct {
	Header
	// Base is the revision whose whole placement begins the chain of
	// changes this revision ends: the revision itself when the event
	// carries or names its whole placement.
	Base int `json:"base"`
	// Snapshot names the object, in the plans' object store, that holds
	// this revision's whole document.
	Snapshot string `json:"snapshot,omitempty"`
	// Placement is the whole placement, when the event carries it.
	*Placement
	// Change is the placement as a change of the revision before.
	Change *Change `json:"change,omitempty"`
}

// Kind says which form the event's placement takes: "document",
// "change" or "snapshot".
func (e *Event) Kind() string {
	switch {
	case e.Placement != nil:
		return "document"
	case e.Snapshot != "" || e.Change == nil:
		return "snapshot"
	}
	return "change"
}

// Follows says whether e can be applied to revision rev: it carries its
// whole placement, or the change from rev.
func (e *Event) Follows(rev int) bool {
	return e.Placement != nil || e.Change != nil && e.Revision == rev+1
}

// Change is what a revision's placement changes of the one before's,
// node by node.
type Change struct {
	// Nodes are the nodes whose placement changed, each whole; a node
	// that no longer holds anything is listed with nothing.
	Nodes []NodeChange `json:"nodes"`
	// Pools are every pool of the revision, in order, each with how its
	// node order changed.
	Pools []PoolOrder `json:"pools"`
	// Export is what the resource_pool list needs beyond the pools.
	Export ExportOptions `json:"export"`
}

// NodeChange is one node's placement, whole: its workers (buffers
// included), its entry in each pool it is in, and the reasons recorded
// against it.
type NodeChange struct {
	NodeID  string              `json:"node_id"`
	Workers []Worker            `json:"workers,omitempty"`
	Pools   map[string]PoolNode `json:"pools,omitempty"`
	Notes   []Note              `json:"notes,omitempty"`
}

// PoolOrder is one pool's node order: the order before less Drop, then
// Add; or Nodes, whole, when it changed otherwise.
type PoolOrder struct {
	Name  string   `json:"name"`
	Drop  []string `json:"drop,omitempty"`
	Add   []string `json:"add,omitempty"`
	Nodes []string `json:"nodes,omitempty"`
}

// ErrNotNext is Replay.Apply's answer to an event that does not follow
// the revision it holds.
var ErrNotNext = errors.New("not the next revision")

// Replay rebuilds revisions of a plan: start it from a whole document
// (a snapshot, or an event that carries one) and apply each following
// revision's event.
type Replay struct {
	header Header
	nodes  map[string]*NodeChange
	pools  []PoolOrder // Nodes whole
	export ExportOptions
}

// NewReplay starts a replay at document d.
func NewReplay(d *Document) *Replay {
	r := &Replay{}
	r.reset(d.Header, &d.Placement)
	return r
}

func (r *Replay) reset(h Header, p *Placement) {
	r.header = h
	r.nodes = map[string]*NodeChange{}
	node := func(id string) *NodeChange {
		n := r.nodes[id]
		if n == nil {
			n = &NodeChange{NodeID: id}
			r.nodes[id] = n
		}
		return n
	}
	for _, w := range p.Workers.All() {
		n := node(w.NodeID)
		n.Workers = append(n.Workers, *w)
	}
	r.pools = r.pools[:0]
	for _, pl := range p.Pools {
		po := PoolOrder{Name: pl.Name, Nodes: make([]string, pl.Nodes.Len())}
		for i, pn := range pl.Nodes.All() {
			po.Nodes[i] = pn.NodeID
			n := node(pn.NodeID)
			if n.Pools == nil {
				n.Pools = map[string]PoolNode{}
			}
			n.Pools[pl.Name] = *pn
		}
		r.pools = append(r.pools, po)
	}
	for _, x := range p.Notes {
		n := node(x.NodeID)
		n.Notes = append(n.Notes, x)
	}
	r.export = ExportOptionsOf(p.ResourcePool)
}

// Revision is the revision the replay holds.
func (r *Replay) Revision() int { return r.header.Revision }

// Apply moves the replay to the event's revision, which must follow the
// one it holds (ErrNotNext) unless the event carries its whole placement.
// An event that only names a snapshot cannot be applied: load the
// snapshot and start a new replay from it.
func (r *Replay) Apply(e *Event) error {
	switch {
	case e.Placement != nil:
		r.reset(e.Header, e.Placement)
		return nil
	case e.Change == nil:
		return fmt.Errorf("revision %d is stored whole as snapshot %q: start from it", e.Revision, e.Snapshot)
	case e.Revision != r.header.Revision+1:
		return fmt.Errorf("revision %d after %d: %w", e.Revision, r.header.Revision, ErrNotNext)
	}
	for i, n := range e.Change.Export.Counts {
		if n < 0 || n > MaxGroups {
			return fmt.Errorf("revision %d: export.worker_counts[%d] is %d; want 0 to %d", e.Revision, i, n, MaxGroups)
		}
	}
	for _, nc := range e.Change.Nodes {
		if len(nc.Workers) == 0 && len(nc.Pools) == 0 && len(nc.Notes) == 0 {
			delete(r.nodes, nc.NodeID)
			continue
		}
		cp := nc
		r.nodes[nc.NodeID] = &cp
	}
	prev := map[string][]string{}
	for _, po := range r.pools {
		prev[po.Name] = po.Nodes
	}
	pools := make([]PoolOrder, 0, len(e.Change.Pools))
	for _, po := range e.Change.Pools {
		order := po.Nodes
		if order == nil {
			drop := map[string]bool{}
			for _, id := range po.Drop {
				drop[id] = true
			}
			for _, id := range prev[po.Name] {
				if !drop[id] {
					order = append(order, id)
				}
			}
			order = append(order, po.Add...)
		}
		pools = append(pools, PoolOrder{Name: po.Name, Nodes: order})
	}
	r.pools = pools
	r.header = e.Header
	r.export = e.Change.Export
	return nil
}

// Document is the revision the replay holds, whole.
func (r *Replay) Document() *Document {
	d := &Document{Header: r.header, Placement: Placement{
		ResourcePool:          []PoolExport{},
		Pools:                 []Pool{},
		StorageToTrainWorkers: map[string][]int{},
	}}
	ids := slices.Sorted(maps.Keys(r.nodes))
	var ws []Worker
	for _, id := range ids {
		n := r.nodes[id]
		ws = append(ws, n.Workers...)
		d.Notes = append(d.Notes, n.Notes...)
	}
	// Workers sit by component, then index; buffers last.
	ws = inDocumentOrder(ws)
	if ws == nil {
		ws = []Worker{}
	}
	d.Workers = NewWorkers(ws)
	for _, po := range r.pools {
		nodes := make([]PoolNode, 0, len(po.Nodes))
		for _, id := range po.Nodes {
			if n := r.nodes[id]; n != nil {
				nodes = append(nodes, n.Pools[po.Name])
			}
		}
		d.Pools = append(d.Pools, Pool{Name: po.Name, Nodes: NewPoolNodes(nodes)})
	}
	d.ResourcePool = Export(d.Pools, r.export)
	d.StorageToTrainWorkers = BuffersOf(ws)
	return d
}

// BuffersOf is storage_to_train_workers of workers: each buffer's index
// (as a string) to the indices of the train workers on its node,
// ascending.
func BuffersOf(ws []Worker) map[string][]int {
	train := map[string][]int{}
	for _, w := range ws {
		if w.Component == Train {
			train[w.NodeID] = append(train[w.NodeID], w.Index)
		}
	}
	out := map[string][]int{}
	for _, w := range ws {
		if w.Component == Buffer {
			t := slices.Clone(train[w.NodeID])
			slices.Sort(t)
			out[strconv.Itoa(w.Index)] = t
		}
	}
	return out
}

// ExportOptionsOf reads back the options a resource_pool list was written
// with.
func ExportOptionsOf(rp []PoolExport) ExportOptions {
	var o ExportOptions
	for _, e := range rp {
		o.NodeIDs = append(o.NodeIDs, e.NodeIDs != nil)
		for _, cc := range e.WorkerCounts {
			if k := cc.Component.Rank(); k >= 0 && k < len(o.Counts) && len(cc.PerNode) > 0 {
				o.Counts[k] = len(cc.PerNode[0])
			}
		}
	}
	return o
}

// inDocumentOrder is ws by component, then index. A plan's indices run
// 0..n-1 in each component, so each worker goes straight to its place;
// a comparison sort of 400,000 workers, a follower's most time at every
// revision, only when they do not.
func inDocumentOrder(ws []Worker) []Worker {
	var count [4]int
	for i := range ws {
		r := ws[i].Component.Rank()
		if r < 0 || ws[i].Index < 0 {
			return sortWorkers(ws)
		}
		count[r]++
	}
	var start [4]int
	for r := 1; r < len(count); r++ {
		start[r] = start[r-1] + count[r-1]
	}
	out := make([]Worker, len(ws))
	filled := make([]bool, len(ws))
	for i := range ws {
		r := ws[i].Component.Rank()
		if ws[i].Index >= count[r] || filled[start[r]+ws[i].Index] {
			return sortWorkers(ws)
		}
		k := start[r] + ws[i].Index
		out[k], filled[k] = ws[i], true
	}
	return out
}

func sortWorkers(ws []Worker) []Worker {
	slices.SortFunc(ws, func(a, b Worker) int {
		return cmp.Or(cmp.Compare(a.Component.Rank(), b.Component.Rank()), cmp.Compare(a.Index, b.Index))
	})
	return ws
}
