package planner

import "github.com/poolplanner/poolplanner/plan"

// exportPools writes pools as rlightning's list (plan.Export). node_ids
// (and num_gpus per node) are added wherever loading the list without
// them would pick other nodes, and worker_counts for the components in
// counts (with their groups' number), so that loading the export
// reproduces the plan; order holds each pool's node positions in table,
// which is sorted by node id. exact (a spec with constraints, which
// rlightning's format cannot say) lists node_ids on every pool, so that
// the export names the very nodes the constraints chose.
func exportPools(pools []plan.Pool, order [][]int32, table []*nodeState, counts [nComp]int, exact bool) []plan.PoolExport {
	mixed := exact
	for _, ns := range table {
		mixed = mixed || ns.node.GPUs != table[0].node.GPUs
	}
	used := make([]bool, len(table))
	ids := make([]bool, len(pools))
	for k, p := range pools {
		same := true
		for _, n := range p.Nodes {
			same = same && n.TotalGPUs == p.Nodes[0].TotalGPUs
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
	return plan.Export(pools, plan.ExportOptions{NodeIDs: ids, Counts: counts})
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
