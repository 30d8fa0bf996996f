package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// A replan of several plans publishes their revisions one after the
// other, and a reader of the plan stream (a launcher, the GPU map, a
// standby) sees the plans' latest revisions change one publish at a
// time. So that no GPU is ever held by two plans' latest revisions at
// once, a GPU a plan takes is published only after the revision of the
// plan that gives it up (and that plan's assignments, published right
// after its event). Where plans take from each other in a cycle (A
// takes from B what B takes from A), one of them first publishes a
// release step: a revision of its own that only gives GPUs up, its new
// placement less the workers that wait for GPUs another plan still
// holds; its new revision follows, once those GPUs are free. Both are
// ordinary revisions, numbered in the plan's sequence: each is a
// placement that was in force, in stream order.

// Step is one publish of a replan: Plan (an index into PublishOrder's
// arguments) publishes its new revision, or, with Release, its release
// step (ReleaseStep).
type Step struct {
	Plan    int
	Release bool
}

// PublishOrder orders the publishes of a replan. held[i] is what plan
// i's latest revision holds, next[i] what its new revision holds (GPU
// keys, gpuKeys); the new revisions hold disjoint sets. A plan publishes
// its new revision once no other plan's latest holds a GPU it takes;
// pure givers first, then plans that give and take, then pure takers,
// each group in the order given, wherever that order leaves a choice.
// When every plan left waits for another (a cycle), the plan whose
// release frees the most of what the others wait for publishes its
// release step (after which it holds held[i] ∩ next[i]); and so on
// until none waits. Every plan gets exactly one new-revision step, and
// at most one release step, before it; where the plans take from each
// other in no cycle, there is none. Should the new revisions overlap
// (they must not), the plans that cannot go in turn publish in the
// order given.
func PublishOrder(held, next []map[string]bool) []Step {
	n := len(held)
	// takers: who takes each GPU some plan takes; holders of such a GPU
	// besides the taker are what the taker waits for.
	takers := map[string][]int{}
	for i := range n {
		for k := range next[i] {
			if !held[i][k] {
				takers[k] = append(takers[k], i)
			}
		}
	}
	waiting := make([]int, n)
	// releases[k]: the GPUs plan k gives up that another plan takes.
	releases := make([][]string, n)
	for k := range n {
		for g := range held[k] {
			ts := takers[g]
			if len(ts) == 0 {
				continue
			}
			if !next[k][g] {
				releases[k] = append(releases[k], g)
			}
			for _, i := range ts {
				if i != k {
					waiting[i]++
				}
			}
		}
		slices.Sort(releases[k])
	}
	// A holder that keeps the GPU (next[k][g]: overlapping new
	// revisions) never frees it: its takers stay waiting, and the
	// fallback below publishes them.
	rank := make([]int, n)
	for i := range n {
		gives, takes := !subset(held[i], next[i]), !subset(next[i], held[i])
		switch {
		case gives && !takes:
			rank[i] = 0
		case gives:
			rank[i] = 1
		default:
			rank[i] = 2
		}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return rank[a] - rank[b] })

	out := make([]Step, 0, n)
	done, freed := make([]bool, n), make([]bool, n)
	free := func(k int) {
		freed[k] = true
		for _, g := range releases[k] {
			for _, i := range takers[g] {
				if i != k {
					waiting[i]--
				}
			}
		}
	}
	for left := n; left > 0; {
		progressed := false
		for _, i := range order {
			if done[i] || waiting[i] > 0 {
				continue
			}
			out = append(out, Step{Plan: i})
			done[i], progressed = true, true
			left--
			if !freed[i] {
				free(i)
			}
		}
		if progressed {
			continue
		}
		// A cycle: release where that frees the most waits.
		best, most := -1, 0
		for _, k := range order {
			if done[k] || freed[k] {
				continue
			}
			frees := 0
			for _, g := range releases[k] {
				for _, i := range takers[g] {
					if i != k && !done[i] {
						frees++
					}
				}
			}
			if frees > most {
				best, most = k, frees
			}
		}
		if best < 0 {
			// Nothing to release frees anything: overlapping new
			// revisions. Publish the rest as given.
			for _, i := range order {
				if !done[i] {
					out = append(out, Step{Plan: i})
					done[i] = true
				}
			}
			break
		}
		out = append(out, Step{Plan: best, Release: true})
		free(best)
	}
	return out
}

// Holdings are PublishOrder's arguments for a replan's outcomes: what
// each plan holds before and after, as far as it matters. A plan whose
// placement stays (or that is held as it was, planned[i] false) can neither
// give up nor take anything (the outcomes hold disjoint GPUs), so it is
// left out (nothing before, nothing after); with fewer than two plans
// changing there is no order to find. Only GPUs of the nodes some plan
// changed on count (touched): a replan's cost stays in proportion to
// its change.
func Holdings(jobs []Job, outs []Outcome, planned []bool) (held, next []map[string]bool, touched map[string]bool) {
	held, next = make([]map[string]bool, len(jobs)), make([]map[string]bool, len(jobs))
	var changed []int
	for i, j := range jobs {
		held[i], next[i] = map[string]bool{}, map[string]bool{}
		if planned[i] && (j.Prev == nil || !SamePlacement(j.Prev, outs[i].Plan)) {
			changed = append(changed, i)
		}
	}
	touched = map[string]bool{}
	if len(changed) < 2 {
		return held, next, touched
	}
	for _, i := range changed {
		for _, nc := range Diff(jobs[i].Prev, outs[i].Plan).Nodes {
			touched[nc.NodeID] = true
		}
	}
	for _, i := range changed {
		held[i], next[i] = gpuKeysOn(jobs[i].Prev, touched), gpuKeysOn(outs[i].Plan, touched)
	}
	return held, next, touched
}

// GPUKeys is what a valid plan holds, as PublishOrder compares it: each
// GPU its workers use or its pools allocate as node:index, and each of
// its workers' GPU UUIDs as uuid:UUID, so that a GPU counts as held
// whichever way it is named.
func GPUKeys(p *Plan) map[string]bool { return gpuKeysOn(p, nil) }

// gpuKeysOn is GPUKeys on the nodes of on (nil: every node).
func gpuKeysOn(p *Plan, on map[string]bool) map[string]bool {
	out := map[string]bool{}
	if p == nil || !p.Placed() {
		return out
	}
	for _, w := range p.Workers.All() {
		if on != nil && !on[w.NodeID] {
			continue
		}
		for _, g := range w.GPUs {
			out[gpuKey(w.NodeID, g)] = true
		}
		for _, u := range w.GPUUUIDs {
			out["uuid:"+u] = true
		}
	}
	EachAllocated(p, func(_, node string, _ plan.Component, g int) {
		if on == nil || on[node] {
			out[gpuKey(node, g)] = true
		}
	})
	return out
}

func gpuKey(node string, g int) string { return node + ":" + strconv.Itoa(g) }

// within says whether every GPU w uses is in held (on a node of on;
// nil: every node; elsewhere, held is not known and w's GPUs are).
func within(w *plan.Worker, held, on map[string]bool) bool {
	if on != nil && !on[w.NodeID] {
		return true
	}
	for _, g := range w.GPUs {
		if !held[gpuKey(w.NodeID, g)] {
			return false
		}
	}
	for _, u := range w.GPUUUIDs {
		if !held["uuid:"+u] {
			return false
		}
	}
	return true
}

// ReleaseStep is next, a plan's new revision, restricted to what the
// plan holds already (held, what prev holds): its workers whose GPUs
// are all held (a worker without GPUs: where prev had it), its pools'
// allocations of held GPUs, each pool node's worker counts less the
// workers left out, and the rlightning export and buffers of what is
// left. It takes nothing, and gives up what next gives up. takers names
// the plans that wait for it. held is what the plan holds on the nodes
// of on (nil: every node): elsewhere its GPUs are as they were.
func ReleaseStep(prev, next *Plan, held, on map[string]bool, takers []string) *Plan {
	doc := &Plan{}
	doc.Header = next.Header
	was := func(*plan.Worker) bool { return false }
	if prev != nil && prev.Placed() {
		was = func(w *plan.Worker) bool {
			o := prev.Workers.Find(w.Component, w.Index)
			return o != nil && o.NodeID == w.NodeID
		}
	}
	var kept []plan.Worker
	// out[pool][node][component][group]: the workers left out.
	type at struct {
		pool, node string
		c          plan.Component
	}
	out := map[at][]int{}
	groups := groupEnds(next.Demands)
	for _, w := range next.Workers.All() {
		if len(w.GPUs) > 0 && within(w, held, on) || len(w.GPUs) == 0 && (was(w) || on != nil && !on[w.NodeID]) {
			kept = append(kept, *w)
			continue
		}
		k := at{w.Pool, w.NodeID, w.Component}
		g := groupAt(groups[w.Component], w.Index)
		for len(out[k]) <= g {
			out[k] = append(out[k], 0)
		}
		out[k][g]++
	}
	onNode := map[[2]string]bool{}
	for _, w := range kept {
		onNode[[2]string{w.Pool, w.NodeID}] = true
	}
	present := map[string]bool{}
	doc.Pools = make([]plan.Pool, 0, len(next.Pools))
	for _, pl := range next.Pools {
		nodes := []plan.PoolNode{}
		for _, n := range pl.Nodes.All() {
			nn := *n
			nn.Allocations = make(map[plan.Component][]plan.Range, len(n.Allocations))
			some := false
			for c, rs := range n.Allocations {
				var gs []int
				for _, r := range rs {
					for g := r.First; g <= r.Last; g++ {
						if on != nil && !on[n.NodeID] || held[gpuKey(n.NodeID, g)] {
							gs = append(gs, g)
						}
					}
				}
				if len(gs) > 0 {
					nn.Allocations[c], some = plan.RangesOf(gs), true
				}
			}
			if !some && !onNode[[2]string{pl.Name, n.NodeID}] {
				continue
			}
			nn.WorkerCounts = plan.GroupCounts{}
			for _, c := range plan.GPUComponents {
				counts := slices.Clone(*n.WorkerCounts.Of(c))
				for g, k := range out[at{pl.Name, n.NodeID, c}] {
					if g < len(counts) {
						counts[g] = max(0, counts[g]-k)
					}
				}
				if slices.ContainsFunc(counts, func(k int) bool { return k > 0 }) {
					*nn.WorkerCounts.Of(c) = counts
				}
			}
			nodes = append(nodes, nn)
			present[n.NodeID] = true
		}
		doc.Pools = append(doc.Pools, plan.Pool{Name: pl.Name, Nodes: plan.NewPoolNodes(nodes)})
	}
	doc.ResourcePool = plan.Export(doc.Pools, plan.ExportOptionsOf(next.ResourcePool))
	doc.Workers = plan.NewWorkers(kept)
	doc.StorageToTrainWorkers = plan.BuffersOf(kept)
	for _, nt := range next.Notes {
		if present[nt.NodeID] {
			doc.Notes = append(doc.Notes, nt)
		}
	}
	doc.GPUsHeld = HeldGPUs(doc)
	waiting := next.Workers.Len() - len(kept)
	doc.Warnings = append(slices.Clip(next.Warnings), fmt.Sprintf("release step: %d of %d workers wait for GPUs plan %s gives up; the next revision places them",
		waiting, next.Workers.Len(), strings.Join(takers, ", plan ")))
	return doc
}

// groupEnds is, per component, where each of its scheduling groups'
// worker indices end (the spec's groups, in order).
func groupEnds(ds []plan.Demand) map[plan.Component][]int {
	out := map[plan.Component][]int{}
	for _, d := range ds {
		e := out[d.Component]
		end := d.Workers
		if len(e) > 0 {
			end += e[len(e)-1]
		}
		out[d.Component] = append(e, end)
	}
	return out
}

// groupAt is the group of worker index i, given its component's group
// ends.
func groupAt(ends []int, i int) int {
	for g, e := range ends {
		if i < e {
			return g
		}
	}
	return max(0, len(ends)-1)
}

// Takers names the plans that take a GPU plan i gives up (held, next:
// Holdings').
func Takers(jobs []Job, held, next []map[string]bool, i int) []string {
	var out []string
	for j := range jobs {
		if j == i {
			continue
		}
		for k := range next[j] {
			if held[i][k] && !next[i][k] && !held[j][k] {
				out = append(out, jobs[j].Name)
				break
			}
		}
	}
	return out
}

// subset reports whether every key of a is in b.
func subset(a, b map[string]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
