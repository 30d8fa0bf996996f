package planner

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
	"pgregory.net/rapid"
)

// packRun is how a pack group's workers lie among NVLink domains: the
// domains (a node of none: "node:" and its id) in rank order, each once;
// whether each holds one run of the group's ranks; and, per domain, the
// workers there.
type packRun struct {
	seq        []string
	contiguous bool
	count      map[string]int
}

// packRunOf reads group gi of component ci's placement from p.
func packRunOf(spec *Spec, nodes []Node, p *Plan, ci comp, gi int) packRun {
	dom := map[string]string{}
	for _, n := range nodes {
		dom[n.ID] = domainOf(&nodeState{node: &n})
	}
	groups := [nComp][]WorkerGroup{groupList(spec.Scheduling.Train), groupList(spec.Scheduling.Eval), spec.Scheduling.Env}
	d := newDemand(ci, groups[ci])
	byIndex := map[int]string{}
	var ranks []int
	for _, w := range p.Workers.Slice() {
		if w.Component != ci.Component() {
			continue
		}
		if g, _ := d.groupAt(w.Index); g == gi {
			byIndex[w.Index] = dom[w.NodeID]
			ranks = append(ranks, w.Index)
		}
	}
	slices.Sort(ranks)
	r := packRun{contiguous: true, count: map[string]int{}}
	for _, i := range ranks {
		id := byIndex[i]
		r.count[id]++
		if len(r.seq) > 0 && r.seq[len(r.seq)-1] == id {
			continue
		}
		if slices.Contains(r.seq, id) {
			r.contiguous = false
			continue
		}
		r.seq = append(r.seq, id)
	}
	return r
}

// packCase is a case of testdata/constraints/pack-cases.json: a cluster
// of NVLink domains of uneven room (nodes of no domain beside them), a
// spec run under each strategy listed, and per component with pack the
// domains its workers must use, in rank order (each holding one run of
// its ranks).
type packCase struct {
	Name       string          `json:"name"`
	Note       string          `json:"note"`
	Nodes      []nodeGroup     `json:"nodes"`
	Scheduling json.RawMessage `json:"scheduling"`
	Strategies []string        `json:"strategies"`
	Expect     struct {
		Domains map[string][]string `json:"domains"`
	} `json:"expect"`
}

// TestPackCases: nvlink_domain pack uses the fewest NVLink domains
// (whole domains largest first, the remainder in the domain with the
// least room that holds it), one run of ranks per domain, and a node of
// no domain only when the domains cannot hold the group, under
// disaggregate and colocate alike.
func TestPackCases(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "constraints", "pack-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []packCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		for _, strategy := range c.Strategies {
			t.Run(c.Name+"/"+strategy, func(t *testing.T) {
				var nodes []Node
				for _, ng := range c.Nodes {
					nodes = append(nodes, ng.nodes()...)
				}
				placement, _ := json.Marshal(map[string]string{"mode": "auto", "strategy": strategy})
				doc, _ := json.Marshal(map[string]json.RawMessage{"scheduling": c.Scheduling, "placement": placement})
				spec, err := ParseSpec(doc)
				if err != nil {
					t.Fatalf("spec: %v", err)
				}
				p, err := Compute(spec, nodes)
				if err != nil || !p.Valid() {
					t.Fatalf("no valid plan: %v", err)
				}
				for _, e := range checkPlan(spec, nodes, p) {
					t.Error(e)
				}
				checkConstraints(t, spec, nodes, p)
				exportLoadsBack(t, spec, nodes, p)
				for name, want := range c.Expect.Domains {
					ci := compOf(plan.Component(name))
					r := packRunOf(spec, nodes, p, ci, 0)
					if !slices.Equal(r.seq, want) || !r.contiguous {
						t.Errorf("%s: domains %v (one run of ranks each: %v, workers %v), want %v", name, r.seq, r.contiguous, r.count, want)
					}
				}
			})
		}
	}
}

// genPackCluster draws two to four NVLink domains of one to four 4-GPU
// nodes, their nodes interleaved in rank order, and up to two 8-GPU
// nodes of no domain that sort first or last; a GPU may be sick.
func genPackCluster(t *rapid.T) []Node {
	var sizes []int
	for range rapid.IntRange(2, 4).Draw(t, "domains") {
		sizes = append(sizes, rapid.IntRange(1, 4).Draw(t, "size"))
	}
	nodes := nvlNodes(sizes...)
	for i := range rapid.IntRange(0, 2).Draw(t, "loners") {
		prefix := rapid.SampledFrom([]string{"a", "z"}).Draw(t, "lonerPrefix")
		n := modelNode(fmt.Sprintf("%s%02d", prefix, i), 8, nil, h100)
		nodes = append(nodes, n)
	}
	for i := range nodes {
		nodes[i].CPUs = 64
		if rapid.IntRange(0, 5).Draw(t, "sick") == 0 {
			nodes[i].Unhealthy = []int{rapid.IntRange(0, nodes[i].GPUs-1).Draw(t, "sickGPU")}
		}
	}
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	return nodes
}

// packRoom is, per NVLink domain (a node of none: its own), how many
// workers of group gi of component ci its nodes hold in p or could still
// take on GPUs no worker of p holds: less than it could take when the
// group was placed (other groups took GPUs since), never more.
func packRoom(spec *Spec, nodes []Node, p *Plan, ci comp, gi int, r packRun) map[string]int {
	groups := [nComp][]WorkerGroup{groupList(spec.Scheduling.Train), groupList(spec.Scheduling.Eval), spec.Scheduling.Env}
	g := groups[ci][gi]
	held := map[string]map[int]bool{}
	for _, w := range p.Workers.Slice() {
		if held[w.NodeID] == nil {
			held[w.NodeID] = map[int]bool{}
		}
		for _, x := range w.GPUs {
			held[w.NodeID][x] = true
		}
	}
	room := map[string]int{}
	for id, k := range r.count {
		room[id] += k
	}
	for _, n := range nodes {
		free := 0
		for x := range n.GPUs {
			if !held[n.ID][x] && !slices.Contains(n.Unhealthy, x) {
				free++
			}
		}
		count, frac := gpuCount(g)
		k := free / count
		if count == 1 {
			k = free * int((1+eps)/frac)
		}
		room[domainOf(&nodeState{node: &n})] += k
	}
	return room
}

// TestPackProperties: on random clusters of NVLink domains of uneven
// room (nodes of no domain beside them), under both strategies, each
// pack group keeps one run of ranks per domain, uses no more domains
// than the fewest that could hold it by the room it had (counted from
// the plan: what it holds and what no worker holds), and uses a node of
// no domain only when the domains could not hold it.
func TestPackProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := genPackCluster(t)
		spec := &Spec{}
		domain := func(name string) *Constraints {
			if rapid.IntRange(0, 2).Draw(t, name+"Pack") == 0 {
				return nil
			}
			return &Constraints{NVLinkDomain: DomainPack}
		}
		if rapid.Bool().Draw(t, "hasTrain") {
			spec.Scheduling.Train = &WorkerGroup{WorkerNum: rapid.IntRange(1, 24).Draw(t, "trainWorkers"), NumCPUs: 1,
				NumGPUs: rapid.SampledFrom([]float64{1, 2}).Draw(t, "trainGPUs"), Constraints: domain("train")}
			spec.Scheduling.Buffer = &WorkerGroup{WorkerNum: 1, Auto: true, NumCPUs: 1}
		}
		if rapid.Bool().Draw(t, "hasEval") {
			spec.Scheduling.Eval = &WorkerGroup{WorkerNum: rapid.IntRange(1, 8).Draw(t, "evalWorkers"), NumCPUs: 1, NumGPUs: 1}
		}
		for i := range rapid.IntRange(0, 2).Draw(t, "envGroups") {
			spec.Scheduling.Env = append(spec.Scheduling.Env, WorkerGroup{WorkerNum: rapid.IntRange(1, 24).Draw(t, fmt.Sprintf("env%dWorkers", i)), NumCPUs: 1,
				NumGPUs: rapid.SampledFrom([]float64{1, 0.5}).Draw(t, fmt.Sprintf("env%dGPUs", i)), Constraints: domain(fmt.Sprintf("env%d", i))})
		}
		spec.Placement = Placement{Mode: ModeAuto, Strategy: rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy")}
		p, err := Compute(spec, nodes)
		if err != nil || !p.Valid() {
			return // too much asked: the cluster's room is the witness tests' business
		}
		groups := [nComp][]WorkerGroup{groupList(spec.Scheduling.Train), groupList(spec.Scheduling.Eval), spec.Scheduling.Env}
		for ci, gs := range groups {
			for gi, g := range gs {
				if g.Constraints == nil || g.Constraints.NVLinkDomain != DomainPack {
					continue
				}
				r := packRunOf(spec, nodes, p, comp(ci), gi)
				if !r.contiguous {
					t.Fatalf("%s group %d: ranks not one run per domain: %v %v", comp(ci).Component(), gi, r.seq, r.count)
				}
				room := packRoom(spec, nodes, p, comp(ci), gi, r)
				var rooms, all []int
				total := 0
				for id, k := range room {
					all = append(all, k)
					if !isLoner(id) {
						rooms = append(rooms, k)
						total += k
					}
				}
				loner := slices.ContainsFunc(r.seq, isLoner)
				if total >= g.WorkerNum && loner {
					t.Fatalf("%s group %d: on a node of no domain though the domains hold %d of %d: %v %v", comp(ci).Component(), gi, total, g.WorkerNum, r.seq, r.count)
				}
				if total < g.WorkerNum {
					rooms = all // nodes of no domain count as domains of their own
				}
				slices.Sort(rooms)
				slices.Reverse(rooms)
				fewest, sum := 0, 0
				for _, k := range rooms {
					if sum >= g.WorkerNum {
						break
					}
					sum += k
					fewest++
				}
				used := r.seq
				if len(used) > fewest {
					t.Fatalf("%s group %d: %d domains %v (workers %v), but %d hold it (room %v)", comp(ci).Component(), gi, len(used), r.seq, r.count, fewest, room)
				}
			}
		}
	})
}

func isLoner(domain string) bool { return len(domain) > 5 && domain[:5] == "node:" }
