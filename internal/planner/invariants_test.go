package planner

import (
	"fmt"
	"github.com/poolplanner/poolplanner/plan"
	"math"
	"sort"
)

// checkPlan checks the invariants every valid plan holds (the conformance
// README's list) and returns the first few violations. A degraded plan
// holds them for the workers it places, which with its unplaced ones
// are every worker the spec asks for, each once.
func checkPlan(spec *Spec, nodes []Node, p *Plan) []string {
	var errs []string
	bad := func(format string, args ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	byID := map[string]*Node{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	type dem struct{ gpus, cpus float64 }
	demands := map[plan.Component][]dem{}
	add := func(c plan.Component, g *WorkerGroup) {
		if g == nil {
			return
		}
		for i := 0; i < g.WorkerNum; i++ {
			demands[c] = append(demands[c], dem{g.NumGPUs, g.NumCPUs})
		}
	}
	add(plan.Train, spec.Scheduling.Train)
	add(plan.Eval, spec.Scheduling.Eval)
	for i := range spec.Scheduling.Env {
		add(plan.Env, &spec.Scheduling.Env[i])
	}
	byComp := map[plan.Component][]plan.Worker{}
	for _, w := range p.Workers.Slice() {
		byComp[w.Component] = append(byComp[w.Component], w)
	}
	unplaced := map[plan.Component][]int{}
	switch st := p.PlanState(); {
	case st == plan.StateDegraded && len(p.Unplaced) == 0:
		bad("degraded without unplaced workers")
	case st != plan.StateDegraded && len(p.Unplaced) > 0:
		bad("%s with %d unplaced workers", st, len(p.Unplaced))
	}
	for _, u := range p.Unplaced {
		unplaced[u.Component] = append(unplaced[u.Component], u.Index)
		if u.Reason == "" {
			bad("unplaced %s[%d] without a reason", u.Component, u.Index)
		}
	}
	for c, ds := range demands {
		ws := byComp[c]
		if len(ws)+len(unplaced[c]) != len(ds) {
			bad("%s: %d workers placed and %d unplaced, want %d", c, len(ws), len(unplaced[c]), len(ds))
			continue
		}
		idx := make([]int, len(ws), len(ds))
		for i, w := range ws {
			idx[i] = w.Index
		}
		idx = append(idx, unplaced[c]...)
		sort.Ints(idx)
		for i, x := range idx {
			if x != i {
				bad("%s: indices %v, want 0..%d", c, idx, len(ds)-1)
				break
			}
		}
	}
	trainOn := map[string][]int{}
	for _, w := range byComp[plan.Train] {
		trainOn[w.NodeID] = append(trainOn[w.NodeID], w.Index)
	}
	if spec.Scheduling.Buffer != nil && len(byComp[plan.Train]) > 0 {
		if len(byComp[plan.Buffer]) != len(trainOn) {
			bad("buffer: %d workers, want one per train node (%d)", len(byComp[plan.Buffer]), len(trainOn))
		}
		for _, w := range byComp[plan.Buffer] {
			got := append([]int(nil), p.StorageToTrainWorkers[fmt.Sprint(w.Index)]...)
			want := append([]int(nil), trainOn[w.NodeID]...)
			sort.Ints(got)
			sort.Ints(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				bad("storage_to_train_workers[%d] = %v, want %v", w.Index, got, want)
			}
		}
	}
	// GPU shares by sharing group; CPU load by node.
	groups, forbidden := shareGroups(spec.Placement)
	load := map[string]map[int]map[plan.Component]float64{}
	cpu := map[string]float64{}
	for _, w := range p.Workers.Slice() {
		n := byID[w.NodeID]
		if n == nil {
			bad("%s[%d] on unknown node %s", w.Component, w.Index, w.NodeID)
			continue
		}
		cpu[w.NodeID] += w.CPUs
		if w.Component == plan.Buffer {
			continue
		}
		d := demands[w.Component][w.Index]
		if d.gpus > 0 {
			want := max(1, int(math.Ceil(d.gpus-eps)))
			seen := map[int]bool{}
			for _, g := range w.GPUs {
				seen[g] = true
			}
			if len(w.GPUs) != want || len(seen) != want {
				bad("%s[%d] holds GPUs %v, needs %v", w.Component, w.Index, w.GPUs, d.gpus)
			}
			if math.Abs(w.GPUShare-min(d.gpus, 1)) > 1e-6 {
				bad("%s[%d] gpu_share %v, needs %v", w.Component, w.Index, w.GPUShare, d.gpus)
			}
		}
		if w.CPUs != d.cpus {
			bad("%s[%d] cpus %v, needs %v", w.Component, w.Index, w.CPUs, d.cpus)
		}
		for _, g := range w.GPUs {
			if g < 0 || g >= n.GPUs || !n.Healthy(g) {
				bad("%s[%d] on GPU %d of %s, which is missing or unhealthy", w.Component, w.Index, g, n.ID)
				continue
			}
			if load[n.ID] == nil {
				load[n.ID] = map[int]map[plan.Component]float64{}
			}
			if load[n.ID][g] == nil {
				load[n.ID][g] = map[plan.Component]float64{}
			}
			load[n.ID][g][w.Component] += min(d.gpus, 1)
		}
	}
	for id, used := range cpu {
		if used > byID[id].CPUs+eps {
			bad("node %s: workers hold %v CPUs of %v", id, used, byID[id].CPUs)
		}
	}
	for id, gs := range load {
		for g, l := range gs {
			for _, grp := range groups {
				tot := 0.0
				for _, c := range grp {
					tot += l[c]
				}
				if tot > 1+eps {
					bad("GPU %s/%d over-committed: %v", id, g, l)
				}
			}
			for _, f := range forbidden {
				if l[f[0]] > 0 && l[f[1]] > 0 {
					bad("GPU %s/%d shared by %s and %s", id, g, f[0], f[1])
				}
			}
		}
	}
	// Pools: purity, and every worker inside its component's allocation.
	pools := map[string]plan.Pool{}
	for _, pl := range p.Pools {
		pools[pl.Name] = pl
	}
	home := map[plan.Component]string{}
	if p.Mode != ModeManual {
		if p.Strategy == StrategyDisaggregate {
			home = map[plan.Component]string{plan.Train: TrainPool, plan.Buffer: TrainPool, plan.Eval: RolloutPool, plan.Env: RolloutPool}
		} else {
			home = map[plan.Component]string{plan.Train: GlobalPool, plan.Buffer: GlobalPool, plan.Eval: GlobalPool, plan.Env: GlobalPool}
		}
	}
	for _, w := range p.Workers.Slice() {
		if h, ok := home[w.Component]; ok && w.Pool != h {
			bad("%s[%d] in pool %s, want %s", w.Component, w.Index, w.Pool, h)
		}
		pl, ok := pools[w.Pool]
		if !ok {
			bad("%s[%d] names pool %q, which pools lacks", w.Component, w.Index, w.Pool)
			continue
		}
		if w.Component == plan.Buffer {
			continue
		}
		var alloc []plan.Range
		found := false
		for _, n := range pl.Nodes.All() {
			if n.NodeID == w.NodeID {
				alloc, found = n.Allocations[w.Component], true
			}
		}
		if !found {
			bad("%s[%d] on %s, not in pool %s", w.Component, w.Index, w.NodeID, pl.Name)
		}
		for _, g := range w.GPUs {
			in := false
			for _, r := range alloc {
				in = in || (g >= r.First && g <= r.Last)
			}
			if !in {
				bad("%s[%d] on %s GPU %d outside its allocation %v", w.Component, w.Index, w.NodeID, g, alloc)
			}
		}
	}
	// In auto mode an allocation is exactly the GPUs its workers hold, bar
	// the train GPUs reserved for a buffer that uses CUDA.
	if p.Mode != ModeManual {
		held := map[string]bool{}
		for _, w := range p.Workers.Slice() {
			for _, g := range w.GPUs {
				held[fmt.Sprint(w.Pool, w.NodeID, w.Component, g)] = true
			}
		}
		reserve := spec.Scheduling.Buffer != nil && spec.Scheduling.Buffer.NumGPUs > 0
		for _, pl := range p.Pools {
			for _, n := range pl.Nodes.All() {
				for c, rs := range n.Allocations {
					for _, r := range rs {
						for g := r.First; g <= r.Last; g++ {
							if !held[fmt.Sprint(pl.Name, n.NodeID, c, g)] && !(reserve && c == plan.Train) {
								bad("%s/%s %s allocation holds GPU %d, which no %s worker uses", pl.Name, n.NodeID, c, g, c)
							}
						}
					}
				}
			}
		}
	}
	// resource_pool describes exactly the allocations in pools.
	if got, want := exportedAllocs(p, byID), allocSet(p); fmt.Sprint(got) != fmt.Sprint(want) {
		bad("resource_pool describes %d GPU assignments, pools %d", len(got), len(want))
	}
	return errs
}

func shareGroups(pl Placement) (groups [][]plan.Component, forbidden [][2]plan.Component) {
	sep := [][]plan.Component{{plan.Train}, {plan.Eval}, {plan.Env}}
	switch {
	case pl.Mode == ModeManual:
		return sep, nil
	case pl.Strategy == StrategyDisaggregate && pl.EnvStrategy == EnvStrategyDefault:
		return [][]plan.Component{{plan.Train, plan.Eval, plan.Env}}, nil
	case pl.Strategy == StrategyDisaggregate:
		return sep, [][2]plan.Component{{plan.Train, plan.Eval}, {plan.Train, plan.Env}}
	case pl.EnvStrategy == EnvStrategyDefault:
		return [][]plan.Component{{plan.Train}, {plan.Eval, plan.Env}}, nil
	}
	return sep, nil
}

type assignment struct {
	pool string
	comp plan.Component
	node string
	gpu  int
}

func allocSet(p *Plan) []string {
	var out []string
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes.All() {
			for c, rs := range n.Allocations {
				for _, r := range rs {
					for g := r.First; g <= r.Last; g++ {
						out = append(out, fmt.Sprint(assignment{pl.Name, c, n.NodeID, g}))
					}
				}
			}
		}
	}
	sort.Strings(out)
	return dedup(out)
}

func exportedAllocs(p *Plan, byID map[string]*Node) []string {
	var out []string
	for _, e := range p.ResourcePool {
		var order []string
		if e.NodeIDs != nil {
			order = e.NodeIDs
		} else {
			for _, pl := range p.Pools {
				if pl.Name == e.Name {
					for _, n := range pl.Nodes.All() {
						order = append(order, n.NodeID)
					}
				}
			}
		}
		offs := []int{0}
		for _, id := range order {
			offs = append(offs, offs[len(offs)-1]+byID[id].GPUs)
		}
		for _, ci := range e.Indices {
			rs, err := plan.ParseIndexString(ci.Index)
			if err != nil {
				out = append(out, "bad index "+ci.Index)
				continue
			}
			for _, r := range rs {
				for g := r.First; g <= r.Last; g++ {
					ni := sort.SearchInts(offs, g+1) - 1
					if ni >= len(order) {
						out = append(out, fmt.Sprintf("beyond pool %s: %d", e.Name, g))
						continue
					}
					out = append(out, fmt.Sprint(assignment{e.Name, ci.Component, order[ni], g - offs[ni]}))
				}
			}
		}
	}
	sort.Strings(out)
	return dedup(out)
}

func dedup(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}
