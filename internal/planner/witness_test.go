package planner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// witnessKind is a machine as the witness test builds clusters of them.
type witnessKind struct {
	short, model string
	gpus         int
	memGiB       float64
	nvlink       bool
	numa         []int
	// rack: nodes of this kind share NVLink domains, a few to a rack.
	rack bool
}

var witnessKinds = []witnessKind{
	{short: "A100", model: "NVIDIA A100 80GB PCIe", gpus: 8, memGiB: 80, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{short: "H100", model: "NVIDIA H100 80GB HBM3", gpus: 8, memGiB: 79.6, nvlink: true, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{short: "H200", model: "NVIDIA H200", gpus: 8, memGiB: 140.4, nvlink: true, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{short: "L40S", model: "NVIDIA L40S", gpus: 8, memGiB: 45, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{short: "B200", model: "NVIDIA B200", gpus: 8, memGiB: 179, nvlink: true, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{short: "GB200", model: "NVIDIA GB200", gpus: 4, memGiB: 185, nvlink: true, numa: []int{0, 0, 1, 1}, rack: true},
}

// witness is a cluster being filled with a placement that keeps every
// constraint: each group gets GPUs of its own (valid under every
// strategy, which may share GPUs but never must).
type witness struct {
	nodes []Node
	kind  []int    // per node, its kind
	free  [][]bool // per node and GPU
}

// genWitnessCluster draws one to three kinds of nodes, a few of each,
// with ids that sort in any order among kinds (so the scarce may come
// first), zones and NVLink domains.
func genWitnessCluster(t *rapid.T) *witness {
	w := &witness{}
	kinds := rapid.SliceOfNDistinct(rapid.IntRange(0, len(witnessKinds)-1), 1, 3, rapid.ID[int]).Draw(t, "kinds")
	for _, k := range kinds {
		nk := witnessKinds[k]
		prefix := rapid.SampledFrom([]string{"a", "b", "g", "h", "n", "z"}).Draw(t, "prefix")
		count := rapid.IntRange(1, 6).Draw(t, "count")
		for i := range count {
			n := Node{
				ID:     fmt.Sprintf("%s%02d-%s", prefix, i+1, nk.short),
				IP:     "10.0.0.1",
				CPUs:   256,
				GPUs:   nk.gpus,
				Labels: map[string]string{"zone": rapid.SampledFrom([]string{"a", "b"}).Draw(t, "zone")},
				NUMA:   nk.numa,
			}
			if nk.rack {
				n.Domain = fmt.Sprintf("%s-rack-%d", nk.short, i/rapid.IntRange(1, 3).Draw(t, "rackSize"))
			}
			for g := range nk.gpus {
				n.Models = append(n.Models, nk.model)
				n.MemoryBytes = append(n.MemoryBytes, uint64(nk.memGiB*gib))
				var peers uint64
				if nk.nvlink {
					peers = (1<<nk.gpus - 1) &^ (1 << g)
				}
				n.Peers = append(n.Peers, peers)
			}
			w.nodes = append(w.nodes, n)
		}
	}
	slices.SortFunc(w.nodes, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	for i := range w.nodes {
		n := &w.nodes[i]
		for k, nk := range witnessKinds {
			if n.Models[0] == nk.model {
				w.kind = append(w.kind, k)
			}
		}
		free := slices.Repeat([]bool{true}, n.GPUs)
		if rapid.IntRange(0, 4).Draw(t, "sick") == 0 {
			x := rapid.IntRange(0, n.GPUs-1).Draw(t, "sickGPU")
			n.Unhealthy, free[x] = []int{x}, false
		}
		w.free = append(w.free, free)
	}
	return w
}

// take finds count free GPUs of node i, linked as link asks; nil if none.
func (w *witness) take(i, count int, link string) []int {
	n := &w.nodes[i]
	var free []int
	for g, f := range w.free[i] {
		if f {
			free = append(free, g)
		}
	}
	var held []int
	switch {
	case len(free) < count:
	case count > 1 && link == LinkNUMA:
		held = sameNUMA(free, count, n.NUMA)
	case count > 1 && link == LinkNVLink:
		held = clique(free, count, n.Peers)
	default:
		held = free[:count]
	}
	for _, g := range held {
		w.free[i][g] = false
	}
	return held
}

// genWitnessGroup draws a group and places it on the witness: an anchor
// node, constraints its place keeps (its model, zone, memory, how its
// GPUs are linked, its domain), then up to a drawn number of workers on
// the nodes those constraints allow. It returns the group, or false when
// no worker found room.
func genWitnessGroup(t *rapid.T, w *witness, name string) (WorkerGroup, bool) {
	size := rapid.SampledFrom([]float64{1, 1, 2, 4, 8, 0.5, 0.25}).Draw(t, name+"GPUs")
	count, frac := gpuCount(WorkerGroup{NumGPUs: size})
	var open []int
	for i := range w.nodes {
		if slices.Contains(w.free[i], true) && w.nodes[i].GPUs >= count {
			open = append(open, i)
		}
	}
	if len(open) == 0 {
		return WorkerGroup{}, false
	}
	anchor := rapid.SampledFrom(open).Draw(t, name+"Anchor")
	an, ak := &w.nodes[anchor], witnessKinds[w.kind[anchor]]
	c := &Constraints{}
	if rapid.IntRange(0, 2).Draw(t, name+"Model") > 0 {
		c.GPUModels = []string{ak.short}
	}
	if rapid.IntRange(0, 3).Draw(t, name+"Zone") == 0 {
		c.NodeSelector = map[string]string{"zone": an.Labels["zone"]}
	}
	if rapid.IntRange(0, 3).Draw(t, name+"Memory") == 0 {
		c.MinGPUMemoryGB = float64(int(ak.memGiB))
	}
	if count > 1 {
		links := []string{"", LinkNUMA, LinkPreferNVLink}
		if ak.nvlink {
			links = append(links, LinkNVLink)
		}
		c.GPULink = rapid.SampledFrom(links).Draw(t, name+"Link")
	}
	c.NVLinkDomain = rapid.SampledFrom([]string{"", "", DomainPack, DomainStrict}).Draw(t, name+"Domain")
	link := c.GPULink
	if link == LinkPreferNVLink {
		link = ""
	}
	allowed := func(i int) bool {
		n := &w.nodes[i]
		ok := c.nodeOK(n) && n.GPUs >= count
		for g := range n.GPUs {
			ok = ok && (!c.gpuWise() || c.gpuOK(n, g))
		}
		if c.NVLinkDomain == DomainStrict {
			ok = ok && domainOf(&nodeState{node: n}) == domainOf(&nodeState{node: an})
		}
		return ok
	}
	want := rapid.IntRange(1, 24).Draw(t, name+"Workers")
	placed := 0
	order := append([]int{anchor}, rapid.Permutation(open).Draw(t, name+"Order")...)
	per := int((1 + eps) / frac) // workers to a GPU
	if count > 1 {
		per = 1
	}
	for _, i := range order {
		for allowed(i) && placed < want {
			if w.take(i, count, link) == nil {
				break
			}
			placed = min(want, placed+per)
		}
	}
	if placed == 0 {
		return WorkerGroup{}, false
	}
	g := WorkerGroup{WorkerNum: placed, NumCPUs: float64(rapid.IntRange(0, 2).Draw(t, name+"CPUs")), NumGPUs: size}
	if c.any() {
		g.Constraints = c
	}
	return g, true
}

// TestWitnessProperties: on random mixed clusters (scarce models whose
// nodes may sort first, zones, NUMA nodes, NVLink, racks) a placement
// keeping every constraint is built first, and the spec asks for what it
// placed; the planner must then find a valid plan, under every strategy,
// keeping every invariant and constraint.
func TestWitnessProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := genWitnessCluster(t)
		spec := &Spec{}
		if g, ok := genWitnessGroup(t, w, "train"); ok && rapid.Bool().Draw(t, "hasTrain") {
			spec.Scheduling.Train = &g
			spec.Scheduling.Buffer = &WorkerGroup{WorkerNum: 1, Auto: true, NumCPUs: 1}
		}
		if g, ok := genWitnessGroup(t, w, "eval"); ok && rapid.Bool().Draw(t, "hasEval") {
			spec.Scheduling.Eval = &g
		}
		for i := range rapid.IntRange(0, 3).Draw(t, "envGroups") {
			if g, ok := genWitnessGroup(t, w, fmt.Sprintf("env%d", i)); ok {
				spec.Scheduling.Env = append(spec.Scheduling.Env, g)
			}
		}
		if rapid.IntRange(0, 3).Draw(t, "cpuOnlyEnv") == 0 {
			spec.Scheduling.Env = append(spec.Scheduling.Env, WorkerGroup{WorkerNum: rapid.IntRange(1, 4).Draw(t, "cpuOnlyWorkers"), NumCPUs: 1})
		}
		spec.Placement = Placement{
			Mode:        ModeAuto,
			Strategy:    rapid.SampledFrom([]string{StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy"),
			EnvStrategy: rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, "envStrategy"),
		}
		checkWitness(t, spec, w.nodes)
	})
}

// checkWitness: spec, which a witness placement keeps, has a valid plan
// on nodes, keeping every invariant and constraint, each pack group one
// run of ranks per NVLink domain, and its export loads back in manual
// mode to the same allocations and workers per node.
func checkWitness(t interface {
	fataler
	Error(...any)
}, spec *Spec, nodes []Node) {
	p, err := Compute(spec, nodes)
	if err != nil || !p.Valid() {
		t.Fatalf("no plan where one exists: %v", err)
	}
	for _, e := range checkPlan(spec, nodes, p) {
		t.Fatalf("%s", e)
	}
	checkConstraints(t, spec, nodes, p)
	groups := [nComp][]WorkerGroup{groupList(spec.Scheduling.Train), groupList(spec.Scheduling.Eval), spec.Scheduling.Env}
	for ci, gs := range groups {
		for gi, g := range gs {
			if g.Constraints != nil && g.Constraints.NVLinkDomain == DomainPack {
				if r := packRunOf(spec, nodes, p, comp(ci), gi); !r.contiguous {
					t.Fatalf("%s group %d: nvlink_domain pack, ranks not one run per domain: %v %v", comp(ci).Component(), gi, r.seq, r.count)
				}
			}
		}
	}
	exportLoadsBack(t, spec, nodes, p)
}

// TestWitnessRegressions: cases TestWitnessProperties once failed on
// (testdata/constraints/witness-regressions.json: the nodes and spec it
// drew, as JSON of Node and Spec), checked as it checks them.
func TestWitnessRegressions(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "constraints", "witness-regressions.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name  string
		Nodes []Node
		Spec  Spec
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { checkWitness(t, &c.Spec, c.Nodes) })
	}
}
