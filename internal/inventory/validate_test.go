package inventory

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := func() NodeInventory {
		sim, _ := ParseSimulation("8xH100")
		n := Facts{NodeID: "n1", Hostname: "n1", IP: "10.0.0.1", CPUs: 64}.Inventory()
		n.GPUs = SimulatedGPUs("n1", sim)
		return n
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a simulated node: %v", err)
	}
	numa := -1
	for _, c := range []struct {
		name, want string
		edit       func(*NodeInventory)
	}{
		{"no id", "node_id: missing", func(n *NodeInventory) { n.NodeID = "" }},
		{"negative CPUs", "cpus: -1", func(n *NodeInventory) { n.CPUs = -1 }},
		{"too many CPUs", "cpus: 4097", func(n *NodeInventory) { n.CPUs = 4097 }},
		{"not an IP", `ip: "gpu-07"`, func(n *NodeInventory) { n.IP = "gpu-07" }},
		{"long hostname", "hostname: 1025 bytes", func(n *NodeInventory) { n.Hostname = strings.Repeat("h", 1025) }},
		{"long label", "labels: a label", func(n *NodeInventory) { n.Labels = map[string]string{"k": strings.Repeat("v", 1025)} }},
		{"too many labels", "labels: 257 labels", func(n *NodeInventory) {
			n.Labels = map[string]string{}
			for i := range 257 {
				n.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}},
		{"65 GPUs", "gpus: 65 GPUs", func(n *NodeInventory) {
			for i := len(n.GPUs); i < 65; i++ {
				n.GPUs = append(n.GPUs, GPU{Index: i})
			}
		}},
		{"index out of range", "gpus[0].index: 8 is not allowed", func(n *NodeInventory) { n.GPUs[0].Index = 8 }},
		{"index twice", "gpus[1].index: 0 appears twice", func(n *NodeInventory) { n.GPUs[1].Index, n.GPUs[1].NVLinkPeers = 0, nil }},
		{"UUID twice", "gpus[1].uuid", func(n *NodeInventory) { n.GPUs[1].UUID = n.GPUs[0].UUID }},
		{"long UUID", "gpus[2].uuid: 2000 bytes", func(n *NodeInventory) { n.GPUs[2].UUID = strings.Repeat("u", 2000) }},
		{"NUMA", "gpus[0].numa_node: -1", func(n *NodeInventory) { n.GPUs[0].NUMANode = &numa }},
		{"NVLink to itself", "gpus[3].nvlink_peers", func(n *NodeInventory) { n.GPUs[3].NVLinkPeers = []int{3} }},
		{"NVLink out of range", "gpus[3].nvlink_peers", func(n *NodeInventory) { n.GPUs[3].NVLinkPeers = []int{9} }},
		{"fabric without cluster", "gpus[2].fabric.cluster_uuid", func(n *NodeInventory) { n.GPUs[2].Fabric = &Fabric{CliqueID: 3} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := good()
			c.edit(&n)
			if err := n.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v, want %q", err, c.want)
			}
		})
	}
}
