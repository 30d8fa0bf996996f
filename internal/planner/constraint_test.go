package planner

import (
	"fmt"
	"maps"
	"pgregory.net/rapid"
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// modelNode is a node of gpus GPUs of the given models (cycled), with
// labels.
func modelNode(id string, gpus int, labels map[string]string, models ...string) Node {
	mem := map[string]uint64{"NVIDIA H100 80GB HBM3": 81559 << 20, "NVIDIA H200": 143771 << 20, "NVIDIA L40S": 46068 << 20, "NVIDIA B200": 183359 << 20}
	n := Node{ID: id, IP: "10.0.0.1", CPUs: 64, GPUs: gpus, Labels: labels}
	for g := range gpus {
		m := models[g*len(models)/gpus]
		n.Models = append(n.Models, m)
		n.MemoryBytes = append(n.MemoryBytes, mem[m])
		n.GPUUUIDs = append(n.GPUUUIDs, fmt.Sprintf("GPU-%s-%d", id, g))
	}
	return n
}

const (
	l40s = "NVIDIA L40S"
	h100 = "NVIDIA H100 80GB HBM3"
	h200 = "NVIDIA H200"
)

// TestConstraints: each constraint changes the answer (the same spec
// without it places elsewhere), every worker lands where its group's
// constraints allow, and an unmet constraint invalidates the plan with
// a reason naming the component and the constraint.
func TestConstraints(t *testing.T) {
	zoneA, zoneB := map[string]string{"zone": "a"}, map[string]string{"zone": "b"}
	cases := []struct {
		name  string
		nodes []Node
		group string // the train group's constraint fields
		// want: the node (and GPUs, when set) every train worker lands on.
		node string
		gpus []int
		err  string
	}{
		{name: "gpu_model", nodes: []Node{modelNode("n0", 8, nil, l40s), modelNode("n1", 8, nil, h100)},
			group: "gpu_model: H100", node: "n1"},
		{name: "gpu_model list, case", nodes: []Node{modelNode("n0", 8, nil, l40s), modelNode("n1", 8, nil, h200)},
			group: "gpu_model: [h100, h200]", node: "n1"},
		{name: "min_gpu_memory_gb", nodes: []Node{modelNode("n0", 8, nil, l40s), modelNode("n1", 8, nil, h100)},
			group: "min_gpu_memory_gb: 80", node: "n1"},
		{name: "node_selector", nodes: []Node{modelNode("n0", 8, zoneA, h100), modelNode("n1", 8, zoneB, h100)},
			group: "node_selector: {zone: b}", node: "n1"},
		{name: "only the matching GPUs of a mixed node", nodes: []Node{modelNode("n0", 8, nil, l40s, h100)},
			group: "gpu_model: H100", node: "n0", gpus: []int{4, 5, 6, 7}},
		{name: "no such model", nodes: []Node{modelNode("n0", 8, nil, l40s), modelNode("n1", 8, nil, h100)},
			group: "gpu_model: B200", err: "train: 0 of 4 workers placed; the next needs 1 GPU and 1 CPU; gpu_model [B200] matches no healthy GPU on 2 nodes (n0, n1)"},
		{name: "no such label", nodes: []Node{modelNode("n0", 8, zoneA, h100)},
			group: "node_selector: {zone: b}", err: "train: 0 of 4 workers placed; the next needs 1 GPU and 1 CPU; node_selector zone=b does not match the node's labels on n0"},
		{name: "a file without models", nodes: uniformNodes(2, 8, 64),
			group: "gpu_model: H100", err: "gpu_model [H100] matches no healthy GPU on 2 nodes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := mustSpec(t, fmt.Sprintf("scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1, %s}}\n", c.group))
			p, _ := Compute(spec, c.nodes)
			if c.err != "" {
				if p.Valid() || !strings.Contains(p.Error, c.err) {
					t.Fatalf("valid %v, error %q; want %q", p.Valid(), p.Error, c.err)
				}
				return
			}
			if !p.Valid() {
				t.Fatalf("invalid: %s", p.Error)
			}
			var gpus []int
			for _, w := range p.Workers.Slice() {
				if w.NodeID != c.node {
					t.Errorf("train %d on %s, want %s", w.Index, w.NodeID, c.node)
				}
				gpus = append(gpus, w.GPUs...)
			}
			if c.gpus != nil && fmt.Sprint(gpus) != fmt.Sprint(c.gpus) {
				t.Errorf("GPUs %v, want %v", gpus, c.gpus)
			}
			// Without the constraint the answer differs.
			free, _ := Compute(mustSpec(t, "scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1}}\n"), c.nodes)
			if SamePlacement(free, p) {
				t.Error("the constraint does not change the answer; the case proves nothing")
			}
		})
	}
}

// TestConstraintsReplan: a spec that adds a constraint displaces the
// workers it no longer allows, saying why, and keeps the rest; a node
// whose labels change loses the workers its new labels exclude.
func TestConstraintsReplan(t *testing.T) {
	nodes := []Node{modelNode("n0", 8, map[string]string{"zone": "a"}, l40s), modelNode("n1", 8, map[string]string{"zone": "a"}, h100)}
	free := mustSpec(t, "scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1}, eval: {worker_num: 2, num_cpus: 1, num_gpus: 1}}\n")
	first, _ := Compute(free, nodes)
	if !first.Valid() || !onNodeOf(first, plan.Train, "n0") {
		t.Fatalf("first plan: valid %v; train must start on n0 for the test to mean anything", first.Valid())
	}
	pinned := mustSpec(t, "scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1, gpu_model: H100}, eval: {worker_num: 2, num_cpus: 1, num_gpus: 1}}\n")
	next, ch, _ := Replan(first, pinned, nodes)
	if !next.Valid() || onNodeOf(next, plan.Train, "n0") {
		t.Fatalf("after gpu_model H100: valid %v (%s), train still on n0", next.Valid(), next.Error)
	}
	if !strings.Contains(ch.Summary(), WhyConstraint) {
		t.Errorf("the change does not say why: %s", ch.Summary())
	}
	// The node's labels change: a selector on eval moves it.
	sel := mustSpec(t, "scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1, gpu_model: H100}, eval: {worker_num: 2, num_cpus: 1, num_gpus: 1, node_selector: {zone: a}}}\n")
	third, _, _ := Replan(next, sel, nodes)
	if !third.Valid() {
		t.Fatalf("third: %s", third.Error)
	}
	relabelled := []Node{nodes[0], modelNode("n1", 8, map[string]string{"zone": "b"}, h100)}
	relabelled[0].Labels = map[string]string{"zone": "a"}
	fourth, _, _ := Replan(third, sel, relabelled)
	for _, w := range fourth.Workers.Slice() {
		if w.Component == plan.Eval && w.NodeID == "n1" {
			t.Errorf("eval %d stays on n1 whose zone is now b", w.Index)
		}
	}
}

func onNodeOf(p *Plan, c plan.Component, node string) bool {
	for _, w := range p.Workers.Slice() {
		if w.Component == c && w.NodeID == node {
			return true
		}
	}
	return false
}

// TestConstraintSpecErrors: bad constraint fields are refused naming
// the field and what is allowed.
func TestConstraintSpecErrors(t *testing.T) {
	cases := []struct{ spec, want string }{
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, gpu_model: []}}", "scheduling.train.gpu_model: an empty list matches nothing"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, gpu_model: 7}}", "scheduling.train.gpu_model: want a model name such as H100, or a list of them, got the number 7"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, gpu_model: [H100, 3]}}", "scheduling.train.gpu_model[1]: 3 is not allowed"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, min_gpu_memory_gb: -1}}", "scheduling.train.min_gpu_memory_gb: -1 is not allowed; want a number of gigabytes > 0"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, node_selector: [a]}}", "scheduling.train.node_selector: want a mapping of label: value"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1, node_selector: {zone: {x: 1}}}}", "scheduling.train.node_selector.zone:"},
		{"scheduling: {env: [{worker_num: 1, num_gpus: 0, gpu_model: H100}]}", "scheduling.env[0]: gpu_model and min_gpu_memory_gb need num_gpus > 0"},
		{"scheduling: {train: {worker_num: 1, num_gpus: 1}, buffer: {worker_num: auto, node_selector: {zone: a}}}", "not allowed for buffer"},
	}
	for _, c := range cases {
		_, err := ParseSpec([]byte(c.spec))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.spec, err, c.want)
		}
	}
	// A CPU-only group may still select nodes.
	if _, err := ParseSpec([]byte("scheduling: {env: [{worker_num: 2, num_gpus: 0, node_selector: {zone: a, rack: 7}}]}")); err != nil {
		t.Error(err)
	}
}

// genConstrained is a random cluster of mixed models and zones, and a
// random spec some of whose groups carry constraints.
func genConstrained(t *rapid.T) ([]Node, *Spec) {
	nodes := genNodes(t)
	models := []string{l40s, h100, h200}
	for i := range nodes {
		n := &nodes[i]
		n.Labels = map[string]string{"zone": rapid.SampledFrom([]string{"a", "b"}).Draw(t, "zone")}
		mixed := rapid.IntRange(0, 3).Draw(t, "mixed") == 0
		first := rapid.SampledFrom(models).Draw(t, "model")
		for g := range n.GPUs {
			m := first
			if mixed && g >= n.GPUs/2 {
				m = models[(g+i)%len(models)]
			}
			n.Models = append(n.Models, m)
			n.MemoryBytes = append(n.MemoryBytes, map[string]uint64{l40s: 46068 << 20, h100: 81559 << 20, h200: 143771 << 20}[m])
			n.NUMA = append(n.NUMA, rapid.IntRange(-1, 1).Draw(t, "numa"))
		}
		n.Domain = rapid.SampledFrom([]string{"", "d1", "d2", "d3"}).Draw(t, "domain")
		// NVLink matrices with holes: each pair linked or not, symmetric.
		n.Peers = make([]uint64, n.GPUs)
		full := rapid.Bool().Draw(t, "fullMesh")
		for a := range n.GPUs {
			for b := a + 1; b < n.GPUs; b++ {
				if full || rapid.IntRange(0, 2).Draw(t, "link") > 0 {
					n.Peers[a] |= 1 << b
					n.Peers[b] |= 1 << a
				}
			}
		}
	}
	spec := genSpec(t)
	constrain := func(g *WorkerGroup, name string) {
		if g == nil || rapid.IntRange(0, 2).Draw(t, name+"Free") == 0 {
			return
		}
		c := &Constraints{}
		if rapid.Bool().Draw(t, name+"Zone") {
			c.NodeSelector = map[string]string{"zone": rapid.SampledFrom([]string{"a", "b"}).Draw(t, name+"ZoneValue")}
		}
		if g.NumGPUs > 0 {
			switch rapid.IntRange(0, 3).Draw(t, name+"GPUKind") {
			case 1:
				c.GPUModels = []string{rapid.SampledFrom([]string{"H100", "h200", "L40S", "B200"}).Draw(t, name+"Model")}
			case 2:
				c.GPUModels = []string{"H100", "H200"}
			case 3:
				c.MinGPUMemoryGB = rapid.SampledFrom([]float64{40, 80, 141}).Draw(t, name+"Mem")
			}
		}
		if g.NumGPUs >= 2 {
			c.GPULink = rapid.SampledFrom([]string{"", LinkNVLink, LinkNUMA, LinkPreferNVLink}).Draw(t, name+"Link")
		}
		if g.NumGPUs > 0 {
			c.NVLinkDomain = rapid.SampledFrom([]string{"", "", DomainPack, DomainStrict}).Draw(t, name+"Domain")
		}
		if c.any() {
			g.Constraints = c
		}
	}
	constrain(spec.Scheduling.Train, "train")
	constrain(spec.Scheduling.Eval, "eval")
	for i := range spec.Scheduling.Env {
		constrain(&spec.Scheduling.Env[i], fmt.Sprintf("env%d", i))
	}
	return nodes, spec
}

// checkConstraints: every worker of a valid plan sits on a node and GPUs
// its group's constraints allow.
func checkConstraints(t fataler, spec *Spec, nodes []Node, p *Plan) {
	t.Helper()
	byID := map[string]*Node{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	groups := [nComp][]WorkerGroup{groupList(spec.Scheduling.Train), groupList(spec.Scheduling.Eval), spec.Scheduling.Env}
	strictIn := map[[2]int]string{} // component and group: the domain its workers are in
	for _, w := range p.Workers.Slice() {
		ci := w.Component.Rank()
		if ci < 0 || ci >= nComp {
			continue // buffers follow train
		}
		d := newDemand(comp(ci), groups[ci])
		gi, g := d.groupAt(w.Index)
		c := g.Constraints
		if !c.any() {
			continue
		}
		n := byID[w.NodeID]
		if !c.nodeOK(n) {
			t.Fatalf("%s %d on %s: labels %v, selector %v", w.Component, w.Index, w.NodeID, n.Labels, c.NodeSelector)
		}
		for _, x := range w.GPUs {
			if c.gpuWise() && !c.gpuOK(n, x) {
				t.Fatalf("%s %d on %s GPU %d (%s): constraints %+v", w.Component, w.Index, w.NodeID, x, n.Models[x], *c)
			}
		}
		if c.NVLinkDomain == DomainStrict {
			d := n.Domain
			if d == "" {
				d = "node:" + n.ID
			}
			if have, ok := strictIn[[2]int{ci, gi}]; ok && have != d {
				t.Fatalf("%s group %d: nvlink_domain strict, yet workers in %s and %s", w.Component, gi, have, d)
			}
			strictIn[[2]int{ci, gi}] = d
		}
		if len(w.GPUs) > 1 && !linked(n, w.GPUs, c.GPULink) {
			t.Fatalf("%s %d on %s GPUs %v: not linked as gpu_link %s asks (peers %v, NUMA %v)", w.Component, w.Index, w.NodeID, w.GPUs, c.GPULink, n.Peers, n.NUMA)
		}
	}
}

// TestConstraintProperties: on random mixed clusters and constrained
// specs, valid plans keep every invariant and every constraint,
// validation agrees with planning, and replans after the labels and
// models of a node change keep them too.
func TestConstraintProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, spec := genConstrained(t)
		p, err := Compute(spec, nodes)
		if (err == nil) != p.Valid() {
			t.Fatalf("error %v but valid=%v", err, p.Valid())
		}
		if verr := Validate(spec, nodes); (verr == nil) != p.Valid() {
			t.Fatalf("validate says %v, plan valid=%v", verr, p.Valid())
		}
		if !p.Valid() {
			return
		}
		for _, e := range checkPlan(spec, nodes, p) {
			t.Fatal(e)
		}
		checkConstraints(t, spec, nodes, p)
		exportLoadsBack(t, spec, nodes, p)
		// A node is relabelled and a GPU's model changes (replaced).
		next := append([]Node(nil), nodes...)
		i := rapid.IntRange(0, len(next)-1).Draw(t, "changed")
		n := next[i]
		n.Labels = map[string]string{"zone": rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "newZone")}
		if n.GPUs > 0 {
			n.Models = append([]string(nil), n.Models...)
			n.Models[0] = rapid.SampledFrom([]string{l40s, h100, h200}).Draw(t, "newModel")
		}
		next[i] = n
		r, _, err := Replan(p, spec, next)
		if (err == nil) != r.Valid() {
			t.Fatalf("replan error %v but valid=%v", err, r.Valid())
		}
		if r.Valid() {
			for _, e := range checkPlan(spec, next, r) {
				t.Fatal(e)
			}
			checkConstraints(t, spec, next, r)
		} else if fresh, _ := Compute(spec, next); fresh.Valid() {
			t.Fatalf("the replan is invalid (%s) where a fresh plan is valid", r.Error)
		}
	})
}

// linkNode is a 4-GPU node whose NVLink pairs are {0,2} and {1,3} and
// whose NUMA nodes are 0,1,0,1: the first two free GPUs are linked
// neither way.
func linkNode(id string, nvlink bool) Node {
	n := modelNode(id, 4, nil, h100)
	n.NUMA = []int{0, 1, 0, 1}
	n.Peers = make([]uint64, 4)
	if nvlink {
		n.Peers = []uint64{1 << 2, 1 << 3, 1 << 0, 1 << 1}
	}
	return n
}

// TestGPULink: gpu_link changes which GPUs a multi-GPU worker takes, is
// refused with its reason where no linked GPUs are free, and
// prefer-nvlink settles for less, saying so.
func TestGPULink(t *testing.T) {
	cases := []struct {
		name, link string
		node       Node
		gpus       []int
		err        string
		compromise bool
	}{
		{name: "nvlink", link: "nvlink", node: linkNode("n0", true), gpus: []int{0, 2}},
		{name: "numa", link: "numa", node: linkNode("n0", false), gpus: []int{0, 2}},
		{name: "prefer-nvlink with NVLink", link: "prefer-nvlink", node: linkNode("n0", true), gpus: []int{0, 2}},
		{name: "prefer-nvlink without", link: "prefer-nvlink", node: linkNode("n0", false), gpus: []int{0, 2}, compromise: true},
		{name: "nvlink on PCIe", link: "nvlink", node: linkNode("n0", false), err: "eval: 0 of 1 workers placed; the next needs 2 GPU and 1 CPU; gpu_link nvlink: no node of model H100 80GB HBM3 has 2 NVLink-peer GPUs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := mustSpec(t, fmt.Sprintf("scheduling: {eval: {worker_num: 1, num_cpus: 1, num_gpus: 2, gpu_link: %s}}\n", c.link))
			p, _ := Compute(spec, []Node{c.node})
			if c.err != "" {
				if p.Valid() || !strings.Contains(p.Error, c.err) {
					t.Fatalf("valid %v, error %q; want %q", p.Valid(), p.Error, c.err)
				}
				return
			}
			if !p.Valid() || fmt.Sprint(p.Workers.At(0).GPUs) != fmt.Sprint(c.gpus) {
				t.Fatalf("valid %v (%s), GPUs %v; want %v", p.Valid(), p.Error, p.Workers.At(0).GPUs, c.gpus)
			}
			var noted bool
			for _, x := range p.Explanations {
				for _, rc := range x.Compromises {
					noted = noted || rc.Reason == ReasonPreferNVLink
				}
			}
			if noted != c.compromise {
				t.Errorf("compromise noted %v, want %v: %+v", noted, c.compromise, p.Explanations)
			}
			free, _ := Compute(mustSpec(t, "scheduling: {eval: {worker_num: 1, num_cpus: 1, num_gpus: 2}}\n"), []Node{c.node})
			if c.compromise == false && SamePlacement(free, p) {
				t.Error("the constraint does not change the answer")
			}
		})
	}
	if _, err := ParseSpec([]byte("scheduling: {eval: {worker_num: 1, num_gpus: 1, gpu_link: nvlink}}")); err == nil || !strings.Contains(err.Error(), "scheduling.eval.gpu_link: nvlink links the GPUs of one worker: it needs num_gpus of 2 or more") {
		t.Errorf("gpu_link on a 1-GPU worker: %v", err)
	}
	if _, err := ParseSpec([]byte("scheduling: {eval: {worker_num: 1, num_gpus: 2, gpu_link: pcie}}")); err == nil || !strings.Contains(err.Error(), `"pcie" is not allowed; want any, nvlink, numa or prefer-nvlink`) {
		t.Errorf("gpu_link pcie: %v", err)
	}
}

// nvlNodes is an NVL72-shaped cluster in small: domains of 4-GPU nodes,
// sizes given, their nodes interleaved in rank order so that plain rank
// order spreads a job across every domain.
func nvlNodes(sizes ...int) []Node {
	var nodes []Node
	for round := 0; ; round++ {
		added := false
		for d, size := range sizes {
			if round < size {
				n := modelNode(fmt.Sprintf("n%02d", len(nodes)), 4, nil, "NVIDIA GB200")
				n.Domain = fmt.Sprintf("clique-%d", d)
				nodes = append(nodes, n)
				added = true
			}
		}
		if !added {
			return nodes
		}
	}
}

// domainsOf lists the domains component c's workers use, in rank order,
// each once, and whether each domain's ranks are contiguous.
func domainsOf(p *Plan, nodes []Node, c plan.Component) ([]string, bool) {
	dom := map[string]string{}
	for _, n := range nodes {
		dom[n.ID] = n.Domain
		if n.Domain == "" {
			dom[n.ID] = "node:" + n.ID
		}
	}
	byIndex := map[int]string{}
	for _, w := range p.Workers.Slice() {
		if w.Component == c {
			byIndex[w.Index] = dom[w.NodeID]
		}
	}
	var seq []string
	contiguous := true
	for i := range len(byIndex) {
		d := byIndex[i]
		if len(seq) == 0 || seq[len(seq)-1] != d {
			if slices.Contains(seq, d) {
				contiguous = false
				continue
			}
			seq = append(seq, d)
		}
	}
	return seq, contiguous
}

// TestNVLinkDomain: pack keeps a job in as few NVLink domains as can
// hold it, its ranks contiguous per domain, where rank order would
// spread it over all; strict keeps it in one or says why not.
func TestNVLinkDomain(t *testing.T) {
	nodes := nvlNodes(2, 4, 3) // 8, 16 and 12 GPUs
	cases := []struct {
		name, mode string
		workers    int
		domains    int
		err        string
	}{
		{name: "pack into the domain that holds it", mode: "pack", workers: 12, domains: 1},
		{name: "pack into the fewest", mode: "pack", workers: 20, domains: 2},
		{name: "strict", mode: "strict", workers: 14, domains: 1},
		{name: "strict too big", mode: "strict", workers: 20, err: "Cannot place train: 16 of 20 workers placed; the next needs 1 GPU and 1 CPU; nvlink_domain strict: no NVLink domain has room for all 20 train workers (the largest, clique-1, has room for 16)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y := fmt.Sprintf("scheduling: {train: {worker_num: %d, num_cpus: 1, num_gpus: 1, nvlink_domain: %s}}\n", c.workers, c.mode)
			p, _ := Compute(mustSpec(t, y), nodes)
			if c.err != "" {
				if p.Valid() || !strings.Contains(p.Error, c.err) {
					t.Fatalf("valid %v, error %q; want %q", p.Valid(), p.Error, c.err)
				}
				return
			}
			if !p.Valid() {
				t.Fatal(p.Error)
			}
			seq, contiguous := domainsOf(p, nodes, plan.Train)
			if len(seq) != c.domains || !contiguous {
				t.Errorf("domains %v (contiguous %v), want %d", seq, contiguous, c.domains)
			}
			free, _ := Compute(mustSpec(t, fmt.Sprintf("scheduling: {train: {worker_num: %d, num_cpus: 1, num_gpus: 1}}\n", c.workers)), nodes)
			if seq, _ := domainsOf(free, nodes, plan.Train); len(seq) <= c.domains {
				t.Errorf("without nvlink_domain the job uses %v too; the case proves nothing", seq)
			}
		})
	}
	// A strict component does not drag the other rollout component into
	// its domain.
	mixed := append(nvlNodes(2, 2), modelNode("pcie-1", 8, nil, l40s))
	p, _ := Compute(mustSpec(t, "scheduling: {eval: {worker_num: 2, num_cpus: 1, num_gpus: 2, gpu_model: L40S}, env: [{worker_num: 8, num_cpus: 1, num_gpus: 0.25, nvlink_domain: strict}]}\n"), mixed)
	if !p.Valid() || !onNodeOf(p, plan.Eval, "pcie-1") {
		t.Errorf("eval on L40S with env strict elsewhere: valid %v: %s", p.Valid(), p.Error)
	}
	if _, err := ParseSpec([]byte("scheduling: {env: [{worker_num: 1, num_gpus: 0, nvlink_domain: pack}]}")); err == nil || !strings.Contains(err.Error(), "nvlink_domain: pack places GPU workers among NVLink domains: it needs num_gpus > 0") {
		t.Errorf("nvlink_domain on CPU workers: %v", err)
	}
}

// TestNVLinkDomainProperties: on random domain layouts, a train-only
// job with pack uses the fewest domains the greedy fill can (largest
// room first) with ranks contiguous per domain, and with strict one
// domain or none at all; replans after a node leaves keep strict.
func TestNVLinkDomainProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var sizes []int
		for range rapid.IntRange(1, 4).Draw(t, "domains") {
			sizes = append(sizes, rapid.IntRange(1, 4).Draw(t, "size"))
		}
		nodes := nvlNodes(sizes...)
		for i := range nodes {
			if rapid.IntRange(0, 5).Draw(t, "alone") == 0 {
				nodes[i].Domain = ""
			}
		}
		count := rapid.SampledFrom([]float64{1, 2, 0.5}).Draw(t, "gpus")
		mode := rapid.SampledFrom([]string{"pack", "strict"}).Draw(t, "mode")
		workers := rapid.IntRange(1, 40).Draw(t, "workers")
		spec, err := ParseSpec([]byte(fmt.Sprintf("scheduling: {train: {worker_num: %d, num_cpus: 1, num_gpus: %g, nvlink_domain: %s}}\n", workers, count, mode)))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := Compute(spec, nodes)
		// Room per domain, in workers.
		room := map[string]int{}
		for _, n := range nodes {
			d := n.Domain
			if d == "" {
				d = "node:" + n.ID
			}
			switch count {
			case 2:
				room[d] += n.GPUs / 2
			case 0.5:
				room[d] += n.GPUs * 2
			default:
				room[d] += n.GPUs
			}
		}
		rooms := slices.Sorted(maps.Values(room))
		slices.Reverse(rooms)
		fewest, sum := 0, 0
		for _, r := range rooms {
			if sum >= workers {
				break
			}
			sum += r
			fewest++
		}
		if sum < workers {
			return // the cluster cannot hold it
		}
		if mode == "strict" {
			if p.Valid() != (rooms[0] >= workers) {
				t.Fatalf("strict: valid %v (%s), largest domain room %d, workers %d", p.Valid(), p.Error, rooms[0], workers)
			}
			if !p.Valid() {
				return
			}
			if seq, _ := domainsOf(p, nodes, plan.Train); len(seq) != 1 {
				t.Fatalf("strict: domains %v", seq)
			}
			// A node changes domain or loses a GPU: the replan keeps the
			// job in one domain, or is invalid only where a fresh plan is.
			next := slices.Clone(nodes)
			i := rapid.IntRange(0, len(next)-1).Draw(t, "changed")
			if rapid.Bool().Draw(t, "moveDomain") {
				next[i].Domain = rapid.SampledFrom([]string{"", "clique-0", "clique-9"}).Draw(t, "newDomain")
			} else {
				next[i].Unhealthy = []int{0}
			}
			r, _, _ := Replan(p, spec, next)
			if fresh, _ := Compute(spec, next); r.Valid() != fresh.Valid() {
				t.Fatalf("replan valid %v (%s), fresh valid %v", r.Valid(), r.Error, fresh.Valid())
			}
			if seq, _ := domainsOf(r, next, plan.Train); r.Valid() && len(seq) != 1 {
				t.Fatalf("strict after a replan: domains %v", seq)
			}
			return
		}
		if !p.Valid() {
			t.Fatalf("pack: invalid (%s) where the domains hold %d of %d", p.Error, sum, workers)
		}
		seq, contiguous := domainsOf(p, nodes, plan.Train)
		if len(seq) != fewest || !contiguous {
			t.Fatalf("pack: domains %v (contiguous %v), want %d", seq, contiguous, fewest)
		}
	})
}

// TestModelMatch: gpu_model names whole words of NVML's name, so one
// model is not taken for its neighbour in the family.
func TestModelMatch(t *testing.T) {
	cases := []struct {
		name, model string
		want        bool
	}{
		{"NVIDIA A100-SXM4-80GB", "A100", true},
		{"NVIDIA A100-SXM4-80GB", "A10", false},
		{"NVIDIA A10", "A10", true},
		{"NVIDIA L40S", "L4", false},
		{"NVIDIA L4", "l4", true},
		{"NVIDIA GB200", "B200", false},
		{"NVIDIA GB200", "GB200", true},
		{"NVIDIA H100 80GB HBM3", "h100 80gb", true},
		{"NVIDIA H100 80GB HBM3", "H100 8", false},
		{"Tesla T4", "T4", true},
	}
	for _, c := range cases {
		if got := modelMatch(c.name, c.model); got != c.want {
			t.Errorf("modelMatch(%q, %q) = %v, want %v", c.name, c.model, got, c.want)
		}
	}
}

// TestCliqueBacktracks: NVLink matrices with holes still give a clique
// where one exists, not only where the first GPU's greedy pick finds it.
func TestCliqueBacktracks(t *testing.T) {
	peers := make([]uint64, 4)
	for _, l := range [][2]int{{0, 1}, {0, 2}, {0, 3}, {2, 3}} {
		peers[l[0]] |= 1 << l[1]
		peers[l[1]] |= 1 << l[0]
	}
	if got := clique([]int{0, 1, 2, 3}, 3, peers); fmt.Sprint(got) != "[0 2 3]" {
		t.Errorf("clique = %v, want [0 2 3]", got)
	}
	if got := clique([]int{1, 2, 3}, 3, peers); got != nil {
		t.Errorf("clique of 1,2,3 = %v, want none", got)
	}
}

// TestConstraintsManualCounts: manual pools with worker_counts keep to
// the constraints too.
func TestConstraintsManualCounts(t *testing.T) {
	nodes := []Node{modelNode("n0", 8, map[string]string{"zone": "a"}, l40s, h100)}
	y := `scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1, gpu_model: H100}}
placement: {mode: manual}
resource_pool:
  - {name: p, num_node: 1, num_gpus: 8, node_ids: [n0], train: "0-7", worker_counts: {train: [2]}}
`
	p, _ := Compute(mustSpec(t, y), nodes)
	if !p.Valid() {
		t.Fatal(p.Error)
	}
	for _, w := range p.Workers.Slice() {
		if w.GPUs[0] < 4 {
			t.Errorf("train %d on GPU %d, an L40S", w.Index, w.GPUs[0])
		}
	}
	sel := strings.Replace(y, "gpu_model: H100", "node_selector: {zone: b}", 1)
	if p, _ := Compute(mustSpec(t, sel), nodes); p.Valid() || !strings.Contains(p.Error, "node_selector zone=b does not match") {
		t.Errorf("manual pool on a zone-a node for a zone-b group: valid %v, %q", p.Valid(), p.Error)
	}
}

// TestConstraintGroups: env groups with constraints of their own each
// find their nodes, whatever order the nodes come in; a strict group
// keeps to its domain without dragging the other groups there.
func TestConstraintGroups(t *testing.T) {
	nodes := []Node{modelNode("a-h100", 4, nil, h100), modelNode("b-l40s", 4, nil, l40s)}
	p, _ := Compute(mustSpec(t, "scheduling: {env: [{worker_num: 4, num_cpus: 1, num_gpus: 1, gpu_model: L40S}, {worker_num: 4, num_cpus: 1, num_gpus: 1, gpu_model: H100}]}\n"), nodes)
	if !p.Valid() {
		t.Fatalf("groups of different models: %s", p.Error)
	}
	mixed := append(nvlNodes(2, 2), modelNode("pcie-1", 8, nil, l40s))
	p, _ = Compute(mustSpec(t, "scheduling: {env: [{worker_num: 8, num_cpus: 1, num_gpus: 0.25}, {worker_num: 7, num_cpus: 1, num_gpus: 1, nvlink_domain: strict}]}\n"), mixed)
	if !p.Valid() {
		t.Fatalf("a strict group beside a free one: %s", p.Error)
	}
	doms := map[string]bool{}
	for _, w := range p.Workers.Slice() {
		if w.Index >= 8 {
			for _, n := range mixed {
				if n.ID == w.NodeID {
					doms[n.Domain] = true
				}
			}
		}
	}
	if len(doms) != 1 {
		t.Errorf("the strict group spans %v", doms)
	}
}

// TestStrictReplans: a replan keeps a strict group in one domain when a
// node it holds moves to another domain, or a GPU of its full domain
// fails: it plans afresh rather than split it.
func TestStrictReplans(t *testing.T) {
	nodes := nvlNodes(3, 3) // 12 GPUs a domain
	spec := mustSpec(t, "scheduling: {train: {worker_num: 12, num_cpus: 1, num_gpus: 1, nvlink_domain: strict}}\n")
	first, _ := Compute(spec, nodes)
	if seq, _ := domainsOf(first, nodes, plan.Train); !first.Valid() || len(seq) != 1 {
		t.Fatalf("first: %v %s", seq, first.Error)
	}
	used := first.Workers.At(0).NodeID
	for _, change := range []string{"node moves to another domain", "a GPU fails"} {
		next := slices.Clone(nodes)
		for i := range next {
			if next[i].ID == used {
				if change == "a GPU fails" {
					next[i].Unhealthy = []int{0}
				} else {
					next[i].Domain = "clique-9"
				}
			}
		}
		p, _, _ := Replan(first, spec, next)
		seq, _ := domainsOf(p, next, plan.Train)
		if !p.Valid() || len(seq) != 1 {
			t.Errorf("%s: valid %v (%s), domains %v", change, p.Valid(), p.Error, seq)
		}
	}
}
