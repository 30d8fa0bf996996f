package planner

// document assembles the plan document from the run's pools and workers.
func (b *build) document() *Plan {
	sp := b.spec.Placement
	doc := &Plan{
		Mode:                  sp.Mode,
		Strategy:              sp.Strategy,
		EnvStrategy:           sp.EnvStrategy,
		Warnings:              b.warnings,
		Notes:                 b.notes.list,
		StorageToTrainWorkers: b.s2t,
		Pools:                 []Pool{},
		Workers:               []Worker{},
	}
	if sp.Mode == ModeManual {
		doc.Strategy, doc.EnvStrategy = "", ""
	}
	if doc.StorageToTrainWorkers == nil {
		doc.StorageToTrainWorkers = map[string][]int{}
	}
	for _, p := range b.pools {
		if len(p.nodes) == 0 {
			continue
		}
		pool := Pool{Name: p.name, Nodes: make([]PoolNode, 0, len(p.nodes))}
		for _, pn := range p.nodes {
			n := pn.ns.node
			alloc := make(map[Component][]Range, 3)
			for ci, c := range gpuComponents {
				if len(pn.alloc[ci]) > 0 {
					alloc[c] = rangesOf(pn.alloc[ci])
				}
			}
			pool.Nodes = append(pool.Nodes, PoolNode{NodeID: n.ID, IP: n.IP, TotalGPUs: n.GPUs, TotalCPUs: n.CPUs, Allocations: alloc})
		}
		doc.Pools = append(doc.Pools, pool)
	}
	ids := make([]string, len(b.states))
	mixed := false
	for i, ns := range b.states {
		ids[i] = ns.node.ID
		mixed = mixed || ns.node.GPUs != b.states[0].node.GPUs
	}
	doc.ResourcePool = exportPools(doc.Pools, ids, mixed)
	// Workers by component, then index: each component's workers were
	// placed in index order, so bucketing keeps that order.
	var byComp [4][]Worker
	slot := map[Component]int{Train: 0, Buffer: 1, Eval: 2, Env: 3}
	for _, w := range b.pk.workers {
		byComp[slot[w.Component]] = append(byComp[slot[w.Component]], w)
	}
	byComp[1] = b.buffers
	total := 0
	for _, ws := range byComp {
		total += len(ws)
	}
	doc.Workers = make([]Worker, 0, total)
	for _, ws := range byComp {
		doc.Workers = append(doc.Workers, ws...)
	}
	return doc
}
