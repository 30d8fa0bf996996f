package planner

import (
	"fmt"
	"strings"
	"testing"
)

// TestFeasibilityChain: one entry point answers whether a group may use
// a node and which GPUs, with the reason when not, for a fresh placement
// and for a kept worker alike.
func TestFeasibilityChain(t *testing.T) {
	zoneA := map[string]string{"zone": "a"}
	mixed := modelNode("m", 8, zoneA, l40s, h100) // GPUs 0-3 L40S, 4-7 H100
	pcie := linkNode("p", false)                  // NUMA 0,1,0,1; no NVLink
	cases := []struct {
		name  string
		node  Node
		group string
		gpus  string // the GPUs the node-wide links allow
		held  string // the first worker's
		link  chainLink
		why   string
	}{
		{name: "no constraints", node: mixed, group: "num_gpus: 1", gpus: "[0 1 2 3 4 5 6 7]", held: "[0]"},
		{name: "selector", node: mixed, group: "num_gpus: 1, node_selector: {zone: b}", link: chainNode, why: "node_selector zone=b does not match the node's labels"},
		{name: "model, in part", node: mixed, group: "num_gpus: 1, gpu_model: H100", gpus: "[4 5 6 7]", held: "[4]"},
		{name: "model, none", node: mixed, group: "num_gpus: 1, gpu_model: B200", link: chainModel, why: "gpu_model [B200] matches no healthy GPU"},
		{name: "memory", node: mixed, group: "num_gpus: 1, min_gpu_memory_gb: 80", gpus: "[4 5 6 7]", held: "[4]"},
		{name: "link", node: pcie, group: "num_gpus: 2, gpu_link: nvlink", gpus: "[0 1 2 3]", link: chainLinked, why: linkReason(LinkNVLink, 2)},
		{name: "numa", node: pcie, group: "num_gpus: 2, gpu_link: numa", gpus: "[0 1 2 3]", held: "[0 2]"},
		{name: "cpus", node: mixed, group: "num_gpus: 1, num_cpus: 65", gpus: "[0 1 2 3 4 5 6 7]", link: chainCPUs, why: ReasonCPUsExhausted},
		{name: "too few", node: mixed, group: "num_gpus: 8, gpu_model: H100", gpus: "[4 5 6 7]", link: chainTooFew, why: TooFewGPUs(8)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y := fmt.Sprintf("scheduling: {eval: {worker_num: 1, num_cpus: 1, %s}}\n", c.group)
			if strings.Contains(c.group, "num_cpus") {
				y = fmt.Sprintf("scheduling: {eval: {worker_num: 1, %s}}\n", c.group)
			}
			e := newEngine(mustSpec(t, y), Options{})
			e.loadAll([]Node{c.node}, []int{0})
			ns, g := e.table[0], group{compEval, 0}
			p := newProbe(ns, g, ns.usable)
			held, _, r := e.feasible(&p)
			if r.link != c.link || r.reason != c.why || c.gpus != "" && fmt.Sprint(p.gpus) != c.gpus || c.held != "" && fmt.Sprint(held) != c.held {
				t.Fatalf("feasible: GPUs %v, held %v, refusal %+v; want %s, %s, %d %q", p.gpus, held, r, c.gpus, c.held, c.link, c.why)
			}
			// A worker kept where a new one would go passes the same
			// links; one kept where a new one may not go fails them.
			count := workerGPUs(e.groupSpec(g))
			kept := held
			if kept == nil {
				kept = ns.usable[:count]
			}
			k := probe{ns: ns, g: g, offer: kept, kept: true}
			_, _, kr := e.feasible(&k)
			if r.ok() != kr.ok() && r.link != chainTooFew && r.link != chainLinked {
				t.Errorf("kept on %v: %+v, a new worker: %+v", kept, kr, r)
			}
		})
	}
	// gpu_link: the GPUs the node-wide links allow are the packer's to link; a kept
	// worker on unlinked GPUs is refused with the link's reason.
	spec := mustSpec(t, "scheduling: {eval: {worker_num: 1, num_cpus: 1, num_gpus: 2, gpu_link: numa}}\n")
	e := newEngine(spec, Options{})
	e.loadAll([]Node{pcie}, []int{0})
	if why := e.linkCheck(&pcie, group{compEval, 0}, []int{0, 1}); why != linkReason(LinkNUMA, 2) {
		t.Errorf("GPUs 0 and 1 (NUMA 0 and 1): %q", why)
	}
	if why := e.linkCheck(&pcie, group{compEval, 0}, []int{0, 2}); why != "" {
		t.Errorf("GPUs 0 and 2 (NUMA 0): %q", why)
	}
}

// TestEmptyRoom: the room the scarce-first order and the errors reason
// with counts each constraint in turn, on the node as if empty.
func TestEmptyRoom(t *testing.T) {
	n := modelNode("a", 8, map[string]string{"zone": "a"}, "NVIDIA A100 80GB PCIe")
	n.NUMA = []int{0, 0, 0, 0, 1, 1, 1, 1}
	spec := mustSpec(t, "scheduling: {eval: {worker_num: 1, num_cpus: 1, num_gpus: 8, gpu_model: A100, gpu_link: numa}}\n")
	e := newEngine(spec, Options{})
	e.loadAll([]Node{n}, []int{0})
	var got []int
	for l := layerSize; l <= layerLink; l++ {
		got = append(got, e.emptyRoom(e.table[0], group{compEval, 0}, l))
	}
	if fmt.Sprint(got) != "[1 1 1 0]" {
		t.Errorf("room by layer %v, want [1 1 1 0]: gpu_link numa binds", got)
	}
}
