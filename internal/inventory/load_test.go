package inventory

import (
	"fmt"
	"testing"
)

// TestPlannerNodeTopology: what constraints read reaches the planner's
// node: each GPU's model, memory, NUMA node and NVLink peers, the labels,
// and the NVLink domain (fabric clique first, then the label).
func TestPlannerNodeTopology(t *testing.T) {
	sxm, _ := ParseSimulation("8xH100")
	pcie, _ := ParseSimulation("4xL40S")
	gb, _ := ParseSimulation("4xGB200")
	cases := []struct {
		name   string
		sim    Simulation
		labels map[string]string
		fabric *Fabric
		peers0 uint64
		numa   []int
		domain string
	}{
		{name: "SXM", sim: sxm, peers0: 0xfe, numa: []int{0, 0, 0, 0, 1, 1, 1, 1}},
		{name: "PCIe", sim: pcie, peers0: 0, numa: []int{0, 0, 1, 1}},
		{name: "label", sim: gb, labels: map[string]string{CliqueLabel: "rack-1", "zone": "a"}, peers0: 0xe, numa: []int{0, 0, 1, 1}, domain: "rack-1"},
		{name: "fabric over label", sim: gb, labels: map[string]string{CliqueLabel: "rack-1"}, fabric: &Fabric{ClusterUUID: "c0ffee", CliqueID: 2}, peers0: 0xe, numa: []int{0, 0, 1, 1}, domain: "c0ffee.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv := Facts{NodeID: "n1", Hostname: "n1", IP: "10.0.0.1", CPUs: 64, Labels: c.labels}.Inventory()
			inv.GPUs = SimulatedGPUs("n1", c.sim)
			for i := range inv.GPUs {
				inv.GPUs[i].Fabric = c.fabric
			}
			n, err := inv.PlannerNode()
			if err != nil {
				t.Fatal(err)
			}
			if n.Peers[0] != c.peers0 || fmt.Sprint(n.NUMA) != fmt.Sprint(c.numa) || n.Domain != c.domain {
				t.Errorf("peers[0] %#x numa %v domain %q; want %#x %v %q", n.Peers[0], n.NUMA, n.Domain, c.peers0, c.numa, c.domain)
			}
			if n.Models[0] != c.sim.Model.Name || n.MemoryBytes[0] != c.sim.Model.MemoryBytes || n.Labels["zone"] != c.labels["zone"] {
				t.Errorf("model %q memory %d labels %v", n.Models[0], n.MemoryBytes[0], n.Labels)
			}
		})
	}
}
