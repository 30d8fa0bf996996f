package planner

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// churnWorld is a cluster whose nodes leave and return and whose GPUs
// fail and heal, under two jobs whose specs never change.
type churnWorld struct {
	all   []Node          // every node, as it is when present
	gone  map[string]bool // nodes away
	jobs  []Job
	stats map[string]int
	log   []string // each step, for a failure to show
	// left holds, per node away, each job's workers on it when it left.
	left map[string]map[string][]plan.Worker
}

// present is the inventory: the nodes not away, in id order.
func (w *churnWorld) present() []Node {
	var out []Node
	for _, n := range w.all {
		if !w.gone[n.ID] {
			out = append(out, n)
		}
	}
	return out
}

// churnSpec draws a job that fills a good part of a small cluster.
func churnSpec(t *rapid.T, name string) *Spec {
	s := &Spec{Priority: rapid.SampledFrom([]int{0, 0, 0, 1}).Draw(t, name+".priority")}
	s.Placement = Placement{Mode: ModeAuto,
		Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, name+".strategy"),
		EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, name+".envStrategy")}
	s.Scheduling.Train = &WorkerGroup{WorkerNum: rapid.IntRange(0, 10).Draw(t, name+".train"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{1, 1, 0.5}).Draw(t, name+".trainGPUs")}
	s.Scheduling.Eval = &WorkerGroup{WorkerNum: rapid.IntRange(0, 4).Draw(t, name+".eval"), NumCPUs: 1,
		NumGPUs: rapid.SampledFrom([]float64{1, 2}).Draw(t, name+".evalGPUs")}
	s.Scheduling.Env = []WorkerGroup{{WorkerNum: rapid.IntRange(0, 12).Draw(t, name+".env"),
		NumCPUs: float64(rapid.IntRange(0, 1).Draw(t, name+".envCPUs")), NumGPUs: rapid.SampledFrom([]float64{0.25, 0.5, 1}).Draw(t, name+".envGPUs")}}
	if rapid.Bool().Draw(t, name+".buffer") {
		s.Scheduling.Buffer = &WorkerGroup{Auto: true, NumCPUs: 1, NumGPUs: rapid.SampledFrom([]float64{0, 1}).Draw(t, name+".bufferGPUs")}
	}
	return s
}

// placeHolds reports whether worker wk's place still holds on nodes: its
// node is there with the same facts, its GPUs healthy. (Its CPUs do not
// change here, nor do other jobs take a GPU a job holds, bar a job of
// higher priority.)
func placeHolds(wk *plan.Worker, nodes []Node) bool {
	i := slices.IndexFunc(nodes, func(n Node) bool { return n.ID == wk.NodeID })
	if i < 0 {
		return false
	}
	for _, g := range wk.GPUs {
		if g >= nodes[i].GPUs || !nodes[i].Healthy(g) {
			return false
		}
	}
	return true
}

// TestDegradedChurnProperties: two jobs of unchanging specs on a cluster
// whose nodes leave and return and whose GPUs fail and heal. In every
// revision no GPU serves both and every plan that places workers holds
// the planner's invariants; no worker whose place still holds moves or
// is released (unless a job of higher priority takes its GPUs, or no
// incremental plan but a fresh one places every worker: the job is then
// valid, as Replan always chose), so a degraded job keeps its GPUs
// against one of equal priority; a job that places workers is released
// only by preemption; and a node that leaves and
// returns gets back exactly the workers it had that found no other
// place (same GPUs), while nothing else moves. Now and then a job's
// previous plan is read back from JSON, as after a restart.
func TestDegradedChurnProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 5).Draw(t, "nodes")
		w := &churnWorld{gone: map[string]bool{}, stats: map[string]int{}}
		for i := range n {
			gpus := rapid.SampledFrom([]int{4, 8}).Draw(t, fmt.Sprintf("n%d.gpus", i))
			node := uniformNodes(1, gpus, 64)[0]
			node.ID, node.IP = fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1)
			for g := range node.GPUUUIDs {
				node.GPUUUIDs[g] = fmt.Sprintf("GPU-%s-%d", node.ID, g)
			}
			w.all = append(w.all, node)
		}
		w.jobs = []Job{{Name: "a", Spec: churnSpec(t, "a"), Age: 1}, {Name: "b", Spec: churnSpec(t, "b"), Age: 2}}
		out := PlanAll(w.jobs, w.present())
		for step := range rapid.IntRange(1, 12).Draw(t, "steps") {
			for j := range w.jobs {
				w.jobs[j].Prev = out[j].Plan
				if rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("step%d.json%d", step, j)) == 0 {
					w.jobs[j].Prev = readBack(t, out[j].Plan)
				}
			}
			returned := w.churn(t, step)
			nodes := w.present()
			out = PlanAll(w.jobs, nodes)
			w.check(t, nodes, out, returned)
		}
	})
}

// churn changes the cluster at random; it returns the node that came
// back, if one did.
func (w *churnWorld) churn(t *rapid.T, step int) string {
	i := rapid.IntRange(0, len(w.all)-1).Draw(t, fmt.Sprintf("step%d.node", step))
	n := &w.all[i]
	switch rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("step%d.kind", step)) {
	case 0, 1: // leaves, or returns as it was
		w.gone[n.ID] = !w.gone[n.ID]
		if !w.gone[n.ID] {
			return n.ID
		}
		if w.left == nil {
			w.left = map[string]map[string][]plan.Worker{}
		}
		w.left[n.ID] = map[string][]plan.Worker{}
		for _, job := range w.jobs {
			if job.Prev == nil {
				continue
			}
			for _, wk := range job.Prev.Workers.All() {
				if wk.NodeID == n.ID && wk.Component != plan.Buffer {
					w.left[n.ID][job.Name] = append(w.left[n.ID][job.Name], *wk)
				}
			}
		}
	case 2: // a GPU fails
		if !w.gone[n.ID] {
			n.Unhealthy = append(slices.Clip(n.Unhealthy), rapid.IntRange(0, n.GPUs-1).Draw(t, fmt.Sprintf("step%d.sick", step)))
		}
	default: // it heals
		if !w.gone[n.ID] && len(n.Unhealthy) > 0 {
			n.Unhealthy = n.Unhealthy[1:]
		}
	}
	return ""
}

// readBack is p through JSON, as a planner reads it from the stream.
func readBack(t *rapid.T, p *Plan) *Plan {
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Plan
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	return &q
}

func (w *churnWorld) check(t *rapid.T, nodes []Node, out []Outcome, returned string) {
	var ids []string
	for _, n := range nodes {
		ids = append(ids, fmt.Sprintf("%s%v", n.ID, n.Unhealthy))
	}
	step := fmt.Sprintf("nodes %v returned %q", ids, returned)
	for j, o := range out {
		step += fmt.Sprintf("\n  %s: %s unplaced %v (%s) [%s]", w.jobs[j].Name, placementOf(o.Plan), o.Plan.Unplaced, o.Change.Summary(), o.Plan.Error)
	}
	w.log = append(w.log, step)
	owner := map[string]string{}
	for j, o := range out {
		job := &w.jobs[j]
		p := o.Plan
		if p.Placed() {
			if errs := checkPlan(job.Spec, nodes, p); len(errs) > 0 {
				t.Fatalf("%s (%s): %v", job.Name, p.PlanState(), errs)
			}
			EachHeldGPU(p, func(node string, g int) {
				k := fmt.Sprintf("%s:%d", node, g)
				if other, ok := owner[k]; ok && other != job.Name {
					t.Fatalf("GPU %s held by %s and %s", k, other, job.Name)
				}
				owner[k] = job.Name
			})
		}
		w.stats[string(p.PlanState())]++
		prev := job.Prev
		if prev == nil || !prev.Placed() {
			continue
		}
		other := &w.jobs[1-j]
		preempted := len(p.PreemptedBy) > 0 || other.Spec.Priority > job.Spec.Priority
		if !p.Placed() && !preempted {
			t.Fatalf("%s released (%s) though no job of higher priority took anything", job.Name, p.Error)
		}
		if o.Change.Fresh && p.Valid() {
			// No incremental plan places every worker (a multi-GPU worker
			// finds its GPUs spread), and a plan made afresh does: whole
			// beats keeping places, as a replan always chose.
			w.stats["fresh"]++
			continue
		}
		if preempted {
			continue
		}
		for _, wk := range prev.Workers.All() {
			if wk.Component == plan.Buffer || !placeHolds(wk, nodes) {
				continue
			}
			if now := p.Workers.Find(wk.Component, wk.Index); now == nil || !samePlace(wk, now) {
				w.dump(t, out)
				t.Fatalf("%s %s %d moved from %s%v, where its place holds, to %v (%s, %s)", job.Name, wk.Component, wk.Index, wk.NodeID, wk.GPUs, now, p.PlanState(), o.Change.Summary())
			}
		}
		if returned == "" {
			continue
		}
		// The node came back: the workers it had when it left that found
		// no other place go back, exactly.
		for _, lw := range w.left[returned][job.Name] {
			u := unplacedOf(prev, lw.Component, lw.Index)
			if u == nil || u.NodeID != lw.NodeID || !slices.Equal(u.GPUs, lw.GPUs) || !placeHolds(&lw, nodes) {
				continue
			}
			now := p.Workers.Find(u.Component, u.Index)
			if now == nil || !samePlace(&lw, now) || !slices.Equal(now.GPUUUIDs, lw.GPUUUIDs) {
				w.dump(t, out)
				t.Fatalf("%s %s %d unplaced from %s%v, not back there: %v (%s)", job.Name, u.Component, u.Index, u.NodeID, u.GPUs, now, o.Change.Summary())
			}
			w.stats["returned"]++
		}
	}
}

// TestDegradedChurnHappens: the churn property reaches degraded plans,
// returns and invalid ones (it is not vacuous).
func TestDegradedChurnHappens(t *testing.T) {
	stats := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		n := 3
		w := &churnWorld{gone: map[string]bool{}, stats: stats}
		for i := range n {
			node := uniformNodes(1, 8, 64)[0]
			node.ID = fmt.Sprintf("n%d", i)
			for g := range node.GPUUUIDs {
				node.GPUUUIDs[g] = fmt.Sprintf("GPU-%s-%d", node.ID, g)
			}
			w.all = append(w.all, node)
		}
		w.jobs = []Job{{Name: "a", Spec: churnSpec(rt, "a"), Age: 1}, {Name: "b", Spec: churnSpec(rt, "b"), Age: 2}}
		out := PlanAll(w.jobs, w.present())
		for step := range 6 {
			for j := range w.jobs {
				w.jobs[j].Prev = out[j].Plan
			}
			returned := w.churn(rt, step)
			nodes := w.present()
			out = PlanAll(w.jobs, nodes)
			w.check(rt, nodes, out, returned)
		}
	})
	if stats[string(plan.StateDegraded)] == 0 || stats["returned"] == 0 {
		t.Fatalf("the churn reached no degraded plan, or no return: %v", stats)
	}
	t.Logf("outcomes: %v", stats)
}

// dump logs each job's previous plan and outcome.
func (w *churnWorld) dump(t *rapid.T, out []Outcome) {
	for i, step := range w.log {
		t.Logf("step %d: %s", i, step)
	}
	for j, o := range out {
		job := &w.jobs[j]
		t.Logf("%s priority %d age %d\n  prev %s unplaced %+v\n  now  %s unplaced %+v\n  %s", job.Name, job.Spec.Priority, job.Age,
			placementOf(job.Prev), unplacedOfPlan(job.Prev), placementOf(o.Plan), o.Plan.Unplaced, o.Plan.Error)
	}
}

func unplacedOfPlan(p *Plan) []plan.Unplaced {
	if p == nil {
		return nil
	}
	return p.Unplaced
}
