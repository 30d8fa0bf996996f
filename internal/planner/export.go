package planner

import (
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// exportPools writes pools as rlightning's list (plan.Export). node_ids
// (and num_gpus per node) are added wherever loading the list without
// them would pick other nodes, and worker_counts for the components in
// counts (with their groups' number), so that loading the export
// reproduces the plan; order holds each pool's node positions in table,
// which is sorted by node id. exact (a spec with constraints, which
// rlightning's format cannot say) lists node_ids on every pool, so that
// the export names the very nodes the constraints chose. prev is the
// previous plan's pools as exported; it returns this plan's beside the
// list.
func exportPools(pools []plan.Pool, order [][]int32, table []*nodeState, counts [nComp]int, exact bool, prev []exportedPool) ([]plan.PoolExport, []exportedPool) {
	mixed := exact
	for _, ns := range table {
		mixed = mixed || ns.node.GPUs != table[0].node.GPUs
	}
	used := make([]bool, len(table))
	ids := make([]bool, len(pools))
	for k, p := range pools {
		same := true
		for _, n := range p.Nodes.All() {
			same = same && n.TotalGPUs == p.Nodes.At(0).TotalGPUs
		}
		// Which nodes would rlightning pick without node_ids? The first
		// ones by id that no earlier pool took.
		ids[k] = mixed || !same
		next := 0
		for _, at := range order[k] {
			for next < len(used) && used[next] {
				next++
			}
			ids[k] = ids[k] || int(at) != next
			next++
		}
		for _, at := range order[k] {
			used[at] = true
		}
	}
	out := make([]plan.PoolExport, len(pools))
	made := make([]exportedPool, len(pools))
	for k, p := range pools {
		made[k] = exportedPool{nodes: p.Nodes, ids: ids[k], counts: counts}
		i := slices.IndexFunc(prev, func(x exportedPool) bool { return x.name == p.Name })
		switch {
		case i >= 0 && made[k].sameAs(prev[i]):
			out[k] = prev[i].out
		case i >= 0:
			// The pool changed in part (a worker grown or given up):
			// its index strings are the previous ones, written again
			// only where its entries differ.
			out[k] = plan.ExportAfter(plan.Pool{Name: p.Name, Nodes: prev[i].nodes}, prev[i].out, p, ids[k], counts)
		default:
			out[k] = plan.Export(pools[k:k+1], plan.ExportOptions{NodeIDs: ids[k : k+1], Counts: counts})[0]
		}
		made[k].name, made[k].out = p.Name, out[k]
	}
	return out, made
}

// exportedPool is one pool's entry in a plan's export and what made it:
// plan.Export reads of a pool only its name and entries, and the options.
// A pool whose entries a run shares with the previous plan's (poolsDoc),
// exported with the same options, shares that entry too: index strings
// of 160,000 workers are not written again for a pool nothing changed in.
type exportedPool struct {
	name   string
	nodes  plan.PoolNodes
	ids    bool
	counts [nComp]int
	out    plan.PoolExport
}

// sameAs reports whether x was made from the very entries of p (one list,
// never written in place) with the same options.
func (p exportedPool) sameAs(x exportedPool) bool {
	a, b := p.nodes.Chunks(), x.nodes.Chunks()
	return p.nodes.Len() > 0 && p.nodes.Len() == x.nodes.Len() && len(a) == len(b) && p.ids == x.ids && p.counts == x.counts && sameChunks(a, b)
}

// sameChunks reports whether a and b are one list of chunks: the same
// chunks, each the very one (a list is never written in place).
func sameChunks(a, b [][]plan.PoolNode) bool {
	for i := range a {
		if len(a[i]) != len(b[i]) || len(a[i]) > 0 && &a[i][0] != &b[i][0] {
			return false
		}
	}
	return true
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
