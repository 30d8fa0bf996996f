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
		var slab []Range
		for _, pn := range p.nodes {
			n := pn.ns.node
			alloc := make(map[Component][]Range, 3)
			for ci, c := range gpuComponents {
				if len(pn.alloc[ci]) > 0 {
					if cap(slab)-len(slab) < len(pn.alloc[ci]) {
						slab = make([]Range, 0, max(1024, len(pn.alloc[ci])))
					}
					start := len(slab)
					slab = appendRanges(slab, pn.alloc[ci])
					alloc[c] = slab[start:len(slab):len(slab)]
				}
			}
			pool.Nodes = append(pool.Nodes, PoolNode{NodeID: n.ID, IP: n.IP, TotalGPUs: n.GPUs, TotalCPUs: n.CPUs, Allocations: alloc})
		}
		doc.Pools = append(doc.Pools, pool)
	}
	doc.ResourcePool = exportPools(doc.Pools, b.nodes)
	// Workers sit in their slots by component and index; buffers follow.
	// A plan that failed leaves empty slots, which are dropped.
	ws := b.pk.workers
	if ws == nil {
		ws = []Worker{}
	}
	if b.pk.placed < len(ws) {
		kept := make([]Worker, 0, b.pk.placed)
		for _, w := range ws {
			if w.Component != "" {
				kept = append(kept, w)
			}
		}
		ws = kept
	}
	doc.Workers = append(ws, b.buffers...)
	return doc
}
