package planner

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// glyphs of the GPU map, one per GPU.
var glyph = map[plan.Component]byte{plan.Train: 'T', plan.Eval: 'E', plan.Env: 'V', plan.Buffer: 'B'}

const mapLegend = "T train, E eval, V env, B buffer; lowercase: part of a GPU; * shared; - reserved; . free; x unhealthy"

// maxMapRows bounds the GPU map: past it the middle is elided, since a
// person reads the shape of a 10,000-node plan, not every row.
const maxMapRows = 60

// WriteText writes the plan as a person reads it: validity, pools with
// their index strings (long ones shortened between whole items), and a
// map of every pool node's GPUs in the ids' natural order, runs of alike
// nodes whose ids follow one another folded into one row.
func WriteText(w io.Writer, p *Plan) error {
	bw := bufio.NewWriter(w)
	name := p.Name
	if name == "" {
		name = "(offline)"
	}
	fmt.Fprintf(bw, "plan %s", name)
	if p.Revision > 0 {
		fmt.Fprintf(bw, " revision %d", p.Revision)
	}
	mode := p.Mode
	if p.Strategy != "" {
		mode += ", " + p.Strategy + ", env_strategy " + p.EnvStrategy
	}
	fmt.Fprintf(bw, " (%s): ", mode)
	switch p.PlanState() {
	case plan.StateValid:
		bw.WriteString("valid\n")
	case plan.StateDegraded:
		fmt.Fprintf(bw, "DEGRADED (%d %s unplaced)\n  %s\n", len(p.Unplaced), plural(len(p.Unplaced), "worker", "workers"), p.Error)
	default:
		fmt.Fprintf(bw, "INVALID\n  %s\n", p.Error)
	}
	if p.PendingSpec != nil {
		fmt.Fprintf(bw, "pending spec (this placement is the last spec's): %s\n", p.PendingSpec.Reason)
	}
	if p.Reason != "" {
		fmt.Fprintf(bw, "reason: %s (%d workers moved)\n", p.Reason, p.Moved)
	}
	writeMoved(bw, p)
	writeCounts(bw, p)
	writeUnplaced(bw, p)
	if !p.Valid() {
		writeDemands(bw, p)
	}
	if len(p.ResourcePool) > 0 {
		bw.WriteString("\npools\n")
		for _, e := range p.ResourcePool {
			gpus := 0
			for _, pl := range p.Pools {
				if pl.Name == e.Name {
					for _, n := range pl.Nodes.All() {
						gpus += n.TotalGPUs
					}
				}
			}
			fmt.Fprintf(bw, "  %-14s %d %s, %d GPUs\n", e.Name, e.NumNode, plural(e.NumNode, "node", "nodes"), gpus)
			for _, ci := range e.Indices {
				fmt.Fprintf(bw, "    %-6s %q\n", ci.Component, plan.ShortenIndex(ci.Index, 100))
			}

		}
	}
	writeMap(bw, p)
	for _, s := range p.Warnings {
		fmt.Fprintf(bw, "warning: %s\n", s)
	}
	writeWhy(bw, p.Explanations)
	return bw.Flush()
}

func writeCounts(bw *bufio.Writer, p *Plan) {
	count := map[plan.Component]int{}
	for _, w := range p.Workers.All() {
		count[w.Component]++
	}
	var parts []string
	for _, c := range []plan.Component{plan.Train, plan.Buffer, plan.Eval, plan.Env} {
		if count[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d%s", c, count[c], elasticRange(p, c, count[c])))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(bw, "workers: %s\n", strings.Join(parts, ", "))
	}
}

// elasticRange is " of 4..32" after a component's count when its
// (last) group is elastic: how many it has against its range; with
// several env entries it names the elastic one's own count.
func elasticRange(p *Plan, c plan.Component, total int) string {
	var ds []plan.Demand
	for _, d := range p.Demands {
		if d.Component == c {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 || ds[len(ds)-1].Max == 0 {
		return ""
	}
	d := ds[len(ds)-1]
	if len(ds) == 1 {
		return fmt.Sprintf(" of %d..%d", d.Min, d.Max)
	}
	return fmt.Sprintf(" (%s[%d] %d of %d..%d)", c, len(ds)-1, d.Workers, d.Min, d.Max)
}

type gpuUse struct {
	share map[plan.Component]float64
}

// mapRow is one node's line of the GPU map.
type mapRow struct {
	node, pools, gpus, cpus string
}

// mapNode is what the map shows of one node: its pool entry, the pools
// it is in, the GPUs allocated there, what workers hold of each GPU and
// their CPUs.
type mapNode struct {
	pn    plan.PoolNode
	pools []string
	alloc map[int]bool
	use   []gpuUse
	cpus  float64
}

func writeMap(bw *bufio.Writer, p *Plan) {
	order, info := mapNodes(p)
	if len(order) == 0 {
		return
	}
	slices.SortStableFunc(order, plan.CompareNodeIDs)
	rows := make([]mapRow, 0, len(order))
	for _, id := range order {
		rows = append(rows, info[id].row(id))
	}
	fmt.Fprintf(bw, "\nGPU map (%s)\n", mapLegend)
	writeRuns(bw, foldRows(rows))
}

// mapNodes gathers every pool node, in pool order, with what its workers
// hold.
func mapNodes(p *Plan) ([]string, map[string]*mapNode) {
	var order []string
	info := map[string]*mapNode{}
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes.All() {
			ni := info[n.NodeID]
			if ni == nil {
				ni = &mapNode{pn: *n, alloc: map[int]bool{}, use: make([]gpuUse, n.TotalGPUs)}
				info[n.NodeID] = ni
				order = append(order, n.NodeID)
			}
			ni.pools = append(ni.pools, pl.Name)
			for _, rs := range n.Allocations {
				for _, r := range rs {
					for g := r.First; g <= r.Last; g++ {
						ni.alloc[g] = true
					}
				}
			}
		}
	}
	for _, w := range p.Workers.All() {
		ni := info[w.NodeID]
		if ni == nil {
			continue
		}
		ni.cpus += w.CPUs
		for _, g := range w.GPUs {
			if g < 0 || g >= len(ni.use) {
				continue
			}
			if ni.use[g].share == nil {
				ni.use[g].share = map[plan.Component]float64{}
			}
			ni.use[g].share[w.Component] += w.GPUShare
		}
	}
	return order, info
}

func (ni *mapNode) row(id string) mapRow {
	var g strings.Builder
	for i := 0; i < ni.pn.TotalGPUs; i++ {
		if i > 0 && i%8 == 0 {
			g.WriteByte(' ')
		}
		g.WriteByte(cell(ni.use, i, ni.alloc[i], slices.Contains(ni.pn.UnhealthyGPUs, i)))
	}
	pools := strings.Join(ni.pools, "+")
	if m := shortModel(ni.pn.GPUModel); m != "" {
		pools += "  " + m
	}
	if ni.pn.NVLinkDomain != "" {
		pools += "  domain " + ni.pn.NVLinkDomain
	}
	return mapRow{
		node:  id,
		pools: pools,
		gpus:  g.String(),
		cpus:  fmt.Sprintf("cpus %s/%s", pyNum(ni.cpus), pyNum(ni.pn.TotalCPUs)),
	}
}

// mapRun is rows that differ only in their node id, whose ids follow
// one another (plan.Follows): "a..b (n)" names exactly the n nodes from a
// to b.
type mapRun struct {
	first, last mapRow
	n           int
}

// foldRows folds runs of rows, which are in the ids' natural order
// (plan.CompareNodeIDs): a row joins the run before it when it draws
// alike (model, pools, GPUs, CPUs) and its id is the next of that run's
// last.
func foldRows(rows []mapRow) []mapRun {
	var runs []mapRun
	for _, r := range rows {
		if k := len(runs) - 1; k >= 0 && plan.Follows(runs[k].last.node, r.node) &&
			runs[k].last.pools == r.pools && runs[k].last.gpus == r.gpus && runs[k].last.cpus == r.cpus {
			runs[k].last = r
			runs[k].n++
			continue
		}
		runs = append(runs, mapRun{r, r, 1})
	}
	return runs
}

// writeRuns prints the runs, eliding the middle past maxMapRows.
func writeRuns(bw *bufio.Writer, runs []mapRun) {
	nameW := 0
	for _, r := range runs {
		nameW = max(nameW, len(r.first.node))
		if r.n > 1 {
			nameW = max(nameW, len(r.first.node)+2+len(r.last.node)+len(fmt.Sprintf(" (%d)", r.n)))
		}
	}
	print := func(r mapRun) {
		label := r.first.node
		if r.n > 1 {
			label = fmt.Sprintf("%s..%s (%d)", r.first.node, r.last.node, r.n)
		}
		fmt.Fprintf(bw, "  %-*s  %s  %s  %s\n", nameW, label, r.first.gpus, r.first.pools, r.first.cpus)
	}
	if len(runs) <= maxMapRows {
		for _, r := range runs {
			print(r)
		}
		return
	}
	head, tail := maxMapRows-10, 10
	for _, r := range runs[:head] {
		print(r)
	}
	hidden := 0
	for _, r := range runs[head : len(runs)-tail] {
		hidden += r.n
	}
	fmt.Fprintf(bw, "  ... %d more nodes in %d distinct rows ...\n", hidden, len(runs)-head-tail)
	for _, r := range runs[len(runs)-tail:] {
		print(r)
	}
}

// cell is the glyph of one GPU.
func cell(u []gpuUse, i int, allocated, unhealthy bool) byte {
	if unhealthy {
		return 'x'
	}
	if u[i].share == nil {
		if allocated {
			return '-'
		}
		return '.'
	}
	if len(u[i].share) > 1 {
		return '*'
	}
	for c, s := range u[i].share {
		g := glyph[c]
		if s < 1-eps {
			g += 'a' - 'A'
		}
		return g
	}
	return '.'
}

// writeMoved says how many workers moved, and which of the previous
// plan's workers were placed again, and why (some may land where they
// were).
func writeMoved(bw *bufio.Writer, p *Plan) {
	var parts []string
	for _, x := range p.Explanations {
		for _, r := range x.Displaced {
			parts = append(parts, fmt.Sprintf("%s: %s", x.Component, r))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(bw, "moved %d %s; placed again: %s\n", p.Moved, plural(p.Moved, "worker", "workers"), strings.Join(parts, "; "))
	}
}

// maxUnplacedLines bounds the lines of unplaced workers the text shows.
const maxUnplacedLines = 20

// writeUnplaced lists a degraded plan's unplaced workers by component and
// reason, with where they ran last.
func writeUnplaced(bw *bufio.Writer, p *Plan) {
	if len(p.Unplaced) == 0 {
		return
	}
	type group struct {
		comp       plan.Component
		why, where string
		idx        []int
	}
	var groups []*group
	by := map[string]*group{}
	for _, u := range p.Unplaced {
		where := ""
		if u.NodeID != "" {
			where = " (last on " + u.NodeID + ")"
		}
		k := string(u.Component) + "\x00" + u.Reason + "\x00" + where
		g := by[k]
		if g == nil {
			g = &group{comp: u.Component, why: u.Reason, where: where}
			by[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, u.Index)
	}
	bw.WriteString("unplaced (each returns to its last place when that holds again)\n")
	for i, g := range groups {
		if i == maxUnplacedLines {
			fmt.Fprintf(bw, "  ... and %d more\n", len(groups)-i)
			break
		}
		slices.Sort(g.idx)
		fmt.Fprintf(bw, "  %s %s: %s%s\n", g.comp, plan.ShortenIndex(plan.FormatRanges(plan.RangesOf(g.idx)), 60), g.why, g.where)
	}
}

// writeDemands shows what an invalid plan's spec asked of what there is.
func writeDemands(bw *bufio.Writer, p *Plan) {
	var parts []string
	for _, d := range p.Demands {
		n := strconv.Itoa(d.Workers)
		if d.Auto {
			n = "auto"
		}
		parts = append(parts, fmt.Sprintf("%s %s x (%s GPU, %s CPU)", d.Component, n, pyNum(d.NumGPUs), pyNum(d.NumCPUs)))
	}
	if len(parts) > 0 {
		fmt.Fprintf(bw, "asked: %s\n", strings.Join(parts, ", "))
	}
	c := p.Capacity
	fmt.Fprintf(bw, "capacity: GPUs %s required, %d available; CPUs %s required, %s available\n",
		pyNum(c.GPUsRequired), c.GPUsAvailable, pyNum(c.CPUsRequired), pyNum(c.CPUsAvailable))
}

// writeWhy prints the explanations: per component, what excluded nodes,
// which compromises were made, what moved.
func writeWhy(bw *bufio.Writer, xs []plan.Explanation) {
	if len(xs) == 0 {
		return
	}
	bw.WriteString("\nwhy\n")
	for _, x := range xs {
		for _, line := range strings.Split(strings.TrimSuffix(x.Text(), "\n"), "\n") {
			fmt.Fprintf(bw, "  %s\n", line)
		}
	}
}

// shortModel is a model as a map row shows it: without the maker's name
// ("NVIDIA H100 80GB HBM3" is "H100 80GB HBM3").
func shortModel(m string) string {
	parts := strings.Split(m, "+")
	for i, p := range parts {
		parts[i] = strings.TrimPrefix(strings.TrimPrefix(p, "NVIDIA "), "Tesla ")
	}
	return strings.Join(parts, "+")
}
