// Package gpumap is the live GPU map `planner serve --http-listen`
// serves: every node a row, every GPU a cell coloured by plan and
// component, identical neighbouring nodes folded into one row (so a
// browser draws a 20,000-node cluster in a few hundred rows), the plans'
// revisions, reasons and validity on top. The page redraws when a new
// revision arrives (server-sent events, cued by the server's own NATS
// subscription to the plans' subjects), and a click on a cell asks the
// server for the workers on that GPU and why they are there.
package gpumap

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// Source is what the map draws: each plan's latest revision and the live
// inventory. The planner service is one.
type Source interface {
	Plans() []*planner.Plan
	Inventory() []inventory.NodeInventory
}

// Drains is a Source that also says what is out of placement on
// purpose (drains, hold-outs, probations): the map marks those GPUs.
type Drains interface {
	DrainedGPUs() []plan.Drain
}

// Map is the document the page draws (GET /api/map).
type Map struct {
	Plans []PlanHead `json:"plans"`
	// Rows are the nodes in id order, runs of identical ones folded.
	Rows  []Row `json:"rows"`
	Nodes int   `json:"nodes"`
	GPUs  int   `json:"gpus"`
	// Unplanned counts the GPUs in unplanned use: running processes
	// though no worker is placed on them.
	Unplanned int `json:"unplanned_gpus"`
}

// PlanHead is what the map says of a plan on top.
type PlanHead struct {
	Name     string     `json:"name"`
	Revision int        `json:"revision"`
	Valid    bool       `json:"valid"`
	Reason   string     `json:"reason"`
	Error    string     `json:"error,omitempty"`
	Priority int        `json:"priority"`
	GPUsHeld int        `json:"gpus_held"`
	Workers  int        `json:"workers"`
	Pools    []PoolHead `json:"pools"`
}

// PoolHead is one pool of a plan: its name and how many nodes it has.
type PoolHead struct {
	Name  string `json:"name"`
	Nodes int    `json:"nodes"`
}

// Row is one node, or a run of identical neighbouring nodes (Count > 1,
// First to Last, every node between them in the ids' natural order:
// plan.CompareNodeIDs), of one GPU model.
type Row struct {
	First string `json:"first"`
	Last  string `json:"last,omitempty"`
	Count int    `json:"count"`
	// Model is the nodes' GPU model (NVML's names, "+" between several).
	Model string `json:"model,omitempty"`
	// Pools are the plans' pools the node is in, as "plan/pool".
	Pools []string `json:"pools,omitempty"`
	Cells []Cell   `json:"cells"`
}

// Cell is one GPU: who holds what share of it, or that it is unhealthy.
type Cell struct {
	Held      []Holding `json:"held,omitempty"`
	Unhealthy bool      `json:"unhealthy,omitempty"`
	// Drained says, when the GPU is out of placement on purpose, why:
	// "drained (driver upgrade)", "leaving at ...", "flapping (...)",
	// "probation (...)".
	Drained string `json:"drained,omitempty"`
	// Unplanned are the processes on a GPU no worker is placed on
	// (unplanned use: a worker moved away still running, or work from
	// outside poolplanner).
	Unplanned []inventory.Process `json:"unplanned,omitempty"`
}

// Holding is a plan's component's share of a GPU (summed over its
// workers there); share 0: the plan's pool holds the GPU for the
// component with no worker on it (a buffer's reserve, a manual range).
type Holding struct {
	Plan      int     `json:"plan"` // index into Map.Plans
	Component string  `json:"component"`
	Share     float64 `json:"share"`
}

// Build draws the map of plans on nodes.
func Build(plans []*planner.Plan, nodes []inventory.NodeInventory) *Map {
	return BuildDrained(plans, nodes, nil, time.Time{})
}

// BuildDrained is Build with the GPUs drains take out marked (as of
// now: a drain before its deadline is leaving).
func BuildDrained(plans []*planner.Plan, nodes []inventory.NodeInventory, drains []plan.Drain, now time.Time) *Map {
	plans = slices.Clone(plans)
	slices.SortFunc(plans, func(a, b *planner.Plan) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), strings.Compare(a.Name, b.Name))
	})
	m := &Map{Plans: make([]PlanHead, len(plans)), Rows: []Row{}, Nodes: len(nodes)}
	pools := map[string][]string{}
	cells := map[string][]Cell{}
	models := map[string]string{}
	for _, n := range nodes {
		cells[n.NodeID] = emptyCells(n)
		models[n.NodeID] = modelOf(n)
		m.GPUs += len(cells[n.NodeID])
	}
	for i, p := range plans {
		h := PlanHead{Name: p.Name, Revision: p.Revision, Valid: p.Valid(), Reason: p.Reason, Error: p.Error,
			Priority: p.Priority, GPUsHeld: p.GPUsHeld, Workers: p.Workers.Len(), Pools: []PoolHead{}}
		for _, pl := range p.Pools {
			h.Pools = append(h.Pools, PoolHead{Name: pl.Name, Nodes: pl.Nodes.Len()})
			for _, n := range pl.Nodes.All() {
				pools[n.NodeID] = append(pools[n.NodeID], p.Name+"/"+pl.Name)
			}
		}
		m.Plans[i] = h
		for _, w := range p.Workers.All() {
			cs := cells[w.NodeID]
			for _, g := range w.GPUs {
				if g >= 0 && g < len(cs) {
					cs[g].Held = hold(cs[g].Held, Holding{Plan: i, Component: string(w.Component), Share: w.GPUShare})
				}
			}
		}
		reserve(p, i, cells)
	}
	for _, d := range drains {
		markDrained(cells[d.NodeID], d, now)
	}
	for _, cs := range cells {
		for g := range cs {
			if slices.ContainsFunc(cs[g].Held, func(h Holding) bool { return h.Share > 0 }) {
				cs[g].Unplanned = nil
			} else if len(cs[g].Unplanned) > 0 {
				m.Unplanned++
			}
		}
	}
	ids := make([]string, 0, len(nodes))
	for _, n := range nodes {
		ids = append(ids, n.NodeID)
	}
	slices.SortFunc(ids, plan.CompareNodeIDs)
	for _, id := range ids {
		row := Row{First: id, Count: 1, Model: models[id], Pools: pools[id], Cells: cells[id]}
		if k := len(m.Rows) - 1; k >= 0 && same(m.Rows[k], row) {
			m.Rows[k].Last = id
			m.Rows[k].Count++
			continue
		}
		m.Rows = append(m.Rows, row)
	}
	return m
}

// drainedText is why a GPU is out, as the map says it, for the drains
// of its node (node, gpu); "" when none takes it out.
func drainedText(drains []plan.Drain, node string, gpu int, now time.Time) string {
	cs := make([]Cell, gpu+1)
	for _, d := range drains {
		if d.NodeID == node {
			markDrained(cs, d, now)
		}
	}
	return cs[gpu].Drained
}

// markDrained marks a node's cells with drain d: every GPU for a
// node's drain.
func markDrained(cs []Cell, d plan.Drain, now time.Time) {
	text := d.Cause
	switch {
	case d.Deadline != nil && now.Before(*d.Deadline):
		text = "leaving at " + d.Deadline.UTC().Format(time.RFC3339)
	case d.Cause == plan.DrainOperator:
		text = "drained"
	}
	if d.Reason != "" {
		text += " (" + d.Reason + ")"
	}
	for g := range cs {
		if d.GPU == nil || *d.GPU == g {
			cs[g].Drained = text
		}
	}
}

// modelOf is a node's GPU model for its row: its GPUs' names, each once,
// in GPU order, joined by "+" ("" for a node without GPUs).
func modelOf(n inventory.NodeInventory) string {
	var seen []string
	for _, g := range n.GPUs {
		if g.Name != "" && !slices.Contains(seen, g.Name) {
			seen = append(seen, g.Name)
		}
	}
	return strings.Join(seen, "+")
}

// emptyCells is a node's GPUs with nobody on them, the unhealthy marked.
func emptyCells(n inventory.NodeInventory) []Cell {
	count := len(n.GPUs)
	for _, g := range n.GPUs {
		count = max(count, g.Index+1)
	}
	cs := make([]Cell, count)
	for _, g := range n.GPUs {
		if g.Index < 0 {
			continue
		}
		cs[g.Index].Unhealthy = !g.Healthy
		// Until a worker is found on it (Build).
		cs[g.Index].Unplanned = g.Processes
	}
	return cs
}

// reserve marks the GPUs plan p (index i) holds in its pools with no
// worker of its own on them.
func reserve(p *planner.Plan, i int, cells map[string][]Cell) {
	planner.EachAllocated(p, func(_, node string, c plan.Component, g int) {
		cs := cells[node]
		if g >= 0 && g < len(cs) && !slices.ContainsFunc(cs[g].Held, func(h Holding) bool { return h.Plan == i }) {
			cs[g].Held = append(cs[g].Held, Holding{Plan: i, Component: string(c)})
		}
	})
}

// hold adds h to a cell's holdings, summing a component's shares.
func hold(held []Holding, h Holding) []Holding {
	for i := range held {
		if held[i].Plan == h.Plan && held[i].Component == h.Component {
			held[i].Share += h.Share
			return held
		}
	}
	return append(held, h)
}

// same reports whether two rows draw alike (but for their names): the
// same GPU model, pools and cells.
func same(a, b Row) bool {
	return a.Model == b.Model && slices.Equal(a.Pools, b.Pools) && slices.EqualFunc(a.Cells, b.Cells, func(x, y Cell) bool {
		return x.Unhealthy == y.Unhealthy && x.Drained == y.Drained && slices.Equal(x.Held, y.Held) && slices.Equal(x.Unplanned, y.Unplanned)
	})
}

// GPUInfo is what a click on a cell shows (GET /api/gpu).
type GPUInfo struct {
	Node      string `json:"node"`
	GPU       int    `json:"gpu"`
	UUID      string `json:"uuid,omitempty"`
	Model     string `json:"model,omitempty"`
	Unhealthy bool   `json:"unhealthy,omitempty"`
	// Drained says why the GPU is out of placement, as its cell does.
	Drained string       `json:"drained,omitempty"`
	Workers []WorkerInfo `json:"workers"`
	// Reserved: plans whose pools hold the GPU with no worker of theirs
	// on it, and for what.
	Reserved []string `json:"reserved,omitempty"`
}

// WorkerInfo is one worker on the GPU, and why it is there.
type WorkerInfo struct {
	Plan     string `json:"plan"`
	Revision int    `json:"revision"`
	plan.Worker
	// Why: its pool, the reasons recorded against the node for its
	// component, and how its component was placed.
	Why []string `json:"why"`
}

// Inspect says who is on GPU gpu of node and why.
func Inspect(plans []*planner.Plan, nodes []inventory.NodeInventory, node string, gpu int) (*GPUInfo, error) {
	info := &GPUInfo{Node: node, GPU: gpu, Workers: []WorkerInfo{}}
	i := slices.IndexFunc(nodes, func(n inventory.NodeInventory) bool { return n.NodeID == node })
	if i < 0 {
		return nil, fmt.Errorf("node %q is not in the inventory", node)
	}
	found := false
	for _, g := range nodes[i].GPUs {
		if g.Index == gpu {
			info.UUID, info.Model, info.Unhealthy, found = g.UUID, g.Name, !g.Healthy, true
		}
	}
	if !found {
		return nil, fmt.Errorf("node %s has no GPU %d", node, gpu)
	}
	for _, p := range plans {
		mine := false
		for _, w := range p.NodeIndex()(node) {
			if slices.Contains(w.GPUs, gpu) {
				info.Workers = append(info.Workers, WorkerInfo{Plan: p.Name, Revision: p.Revision, Worker: w, Why: why(p, w)})
				mine = true
			}
		}
		if !mine {
			info.Reserved = append(info.Reserved, reservedBy(p, node, gpu)...)
		}
	}
	return info, nil
}

// reservedBy says for what p's pools hold a GPU of node, if they do.
func reservedBy(p *planner.Plan, node string, gpu int) []string {
	var out []string
	planner.EachAllocated(p, func(pool, n string, c plan.Component, g int) {
		if n == node && g == gpu {
			out = append(out, fmt.Sprintf("held by plan %s (revision %d), pool %s, for %s, with no worker on it (a buffer's reserve, or a manual pool's range)", p.Name, p.Revision, pool, c))
		}
	})
	return out
}

// why says why w is where it is, from its plan's document.
func why(p *planner.Plan, w plan.Worker) []string {
	out := []string{fmt.Sprintf("in pool %s of plan %s (priority %d), revision %d", w.Pool, p.Name, p.Priority, p.Revision)}
	for _, n := range p.Notes {
		if n.NodeID == w.NodeID && (n.Component == "" || n.Component == w.Component) {
			out = append(out, "on this node: "+n.Reason)
		}
	}
	for _, x := range p.Explanations {
		if x.Component != w.Component {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %d of %d placed", x.Component, x.Placed, x.Asked))
		for _, r := range x.Compromises {
			out = append(out, "compromise: "+r.String())
		}
		for _, r := range x.Excluded {
			out = append(out, "excluded: "+r.String())
		}
		for _, r := range x.Displaced {
			out = append(out, "moved in this revision: "+r.String())
		}
	}
	return out
}
