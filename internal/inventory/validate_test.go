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
	for _, ok := range []func(*NodeInventory){
		func(n *NodeInventory) { n.NodeID = "sim-h100-1" },
		func(n *NodeInventory) { n.NodeID = "gpu-node-07.cluster.local" },
		func(n *NodeInventory) { n.NodeID = "a_b=c/d" },
		func(n *NodeInventory) { n.NodeID = strings.Repeat("n", 63) + "." + strings.Repeat("n", 189) }, // 253
		func(n *NodeInventory) {
			n.Labels = map[string]string{CliqueLabel: "rack-1", "topology.kubernetes.io/zone": "a", "zone": "", strings.Repeat("k", 253): "v"}
		},
	} {
		n := good()
		ok(&n)
		if err := n.Validate(); err != nil {
			t.Errorf("%s %v: %v", n.NodeID, n.Labels, err)
		}
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
		{"long label", "labels.k: a value of 1025 bytes; at most 1024", func(n *NodeInventory) { n.Labels = map[string]string{"k": strings.Repeat("v", 1025)} }},
		{"long label key", `labels: invalid label key "kkkk`, func(n *NodeInventory) { n.Labels = map[string]string{strings.Repeat("k", 254): "v"} }},
		{"label key with a space", `labels: invalid label key "a b": ' ' at byte 1 is not allowed; want 1 to 253 bytes`, func(n *NodeInventory) { n.Labels = map[string]string{"a b": "v"} }},
		{"label key with =", `labels: invalid label key "a=b": '=' at byte 1`, func(n *NodeInventory) { n.Labels = map[string]string{"a=b": "v"} }},
		{"long node id", `node_id: invalid node id "nnnn`, func(n *NodeInventory) { n.NodeID = strings.Repeat("n", 254) }},
		{"node id of 4 KB", "(4100 bytes): 4100 bytes is too long; want 1 to 253 bytes", func(n *NodeInventory) { n.NodeID = strings.Repeat("n", 4100) }},
		{"node id wildcard", `node_id: invalid node id "n*": '*' at byte 1 is not allowed`, func(n *NodeInventory) { n.NodeID = "n*" }},
		{"node id empty token", `node_id: invalid node id "a..b": '.' at byte 1 is not allowed`, func(n *NodeInventory) { n.NodeID = "a..b" }},
		{"no UUID", "gpus[3].uuid: missing", func(n *NodeInventory) { n.GPUs[3].UUID = "" }},
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
		{"NVLink out of range", "gpus[3].nvlink_peers[1]: 9 is not allowed", func(n *NodeInventory) { n.GPUs[3].NVLinkPeers = []int{1, 9} }},
		{"NVLink peers past the GPUs", "gpus[3].nvlink_peers: 20000 listed; at most 7", func(n *NodeInventory) {
			n.GPUs[3].NVLinkPeers = make([]int, 20000)
		}},
		{"UUID with a space", `gpus[1].uuid: ' ' at byte 3 is not allowed`, func(n *NodeInventory) { n.GPUs[1].UUID = "GPU 1" }},
		{"UUID with a newline", `gpus[1].uuid: '\n' at byte 4`, func(n *NodeInventory) { n.GPUs[1].UUID = "GPU-\nforged line" }},
		{"UUID with a control", `gpus[1].uuid: '\x1b' at byte 0`, func(n *NodeInventory) { n.GPUs[1].UUID = "\x1b[31mGPU" }},
		{"UUID not ASCII", `gpus[1].uuid: 'é' at byte 5`, func(n *NodeInventory) { n.GPUs[1].UUID = "GPU-aé" }},
		{"UUID not UTF-8", `gpus[1].uuid: '�' at byte 4`, func(n *NodeInventory) { n.GPUs[1].UUID = "GPU-\xff" }},
		{"fabric without cluster", "gpus[2].fabric.cluster_uuid", func(n *NodeInventory) { n.GPUs[2].Fabric = &Fabric{CliqueID: 3} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := good()
			c.edit(&n)
			err := n.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v, want %q", err, c.want)
			}
			// A reason is one log line: never a hostile value whole.
			if err != nil && len(err.Error()) > 256 {
				t.Errorf("a %d-byte reason", len(err.Error()))
			}
		})
	}
}
