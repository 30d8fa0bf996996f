// Package inventory describes what a node offers the planner: its GPUs,
// CPUs and address, discovered with NVML, simulated, or read from a file.
package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"time"
)

// GPU is one device of a node as the reporter saw it.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	PCIBusID    string `json:"pci_bus_id"`
	Healthy     bool   `json:"healthy"`

	// UnhealthyReason says why Healthy is false (an XID, a failed NVML
	// call), so that an operator reading the bucket need not guess.
	UnhealthyReason string `json:"unhealthy_reason,omitempty"`
	// NUMANode is the NUMA node the GPU hangs off; nil when neither NVML
	// nor sysfs knows (single-socket machines, simulations).
	NUMANode *int `json:"numa_node,omitempty"`
	// MIGEnabled is true when the GPU is in MIG mode; the planner treats
	// such a GPU as whole, but an operator wants to see it.
	MIGEnabled bool `json:"mig_enabled,omitempty"`
	// NVLinkPeers lists the node-local indices of the GPUs this one has an
	// NVLink peer-to-peer path to, ascending; the planner's topology input.
	NVLinkPeers []int `json:"nvlink_peers,omitempty"`
	// Fabric is the GPU's NVLink fabric clique (GB200 and later: NVML's
	// GPU fabric info, once the fabric manager registered it); nil where
	// the GPU has none. GPUs of one cluster UUID and clique id share an
	// NVLink domain across nodes.
	Fabric *Fabric `json:"fabric,omitempty"`
	// Processes are the processes running on the GPU, as NVML lists them
	// (compute and graphics), by pid; at most MaxProcesses. A GPU a
	// worker is about to be given may still run its last holder:
	// planner exec waits until it runs none.
	Processes []Process `json:"processes,omitempty"`
}

// Process is one process on a GPU.
type Process struct {
	PID uint32 `json:"pid"`
	// UsedMemoryBytes is the GPU memory it holds, when NVML says.
	UsedMemoryBytes uint64 `json:"used_memory_bytes,omitempty"`
	// Name is its command name (/proc/PID/comm), where readable.
	Name string `json:"name,omitempty"`
}

// UnnamedUUID is the UUID a reporter gives a GPU NVML cannot name (no
// handle, or DeviceGetUUID failing), which it also marks unhealthy: a
// document names every GPU, and no other GPU, here or on another node,
// has this one ("GPU-unnamed-NODE-INDEX" cannot be NVML's).
func UnnamedUUID(nodeID string, index int) string {
	return fmt.Sprintf("GPU-unnamed-%s-%d", nodeID, index)
}

// Fabric is a GPU's place in a multi-node NVLink fabric.
type Fabric struct {
	ClusterUUID string `json:"cluster_uuid"`
	CliqueID    uint32 `json:"clique_id"`
}

// CliqueLabel is the node label that names a node's NVLink domain where
// NVML cannot (NVIDIA GPU feature discovery's name for it).
const CliqueLabel = "nvidia.com/gpu.clique"

// Domain is the node's NVLink domain: its GPUs' fabric clique, else the
// CliqueLabel label, else "" (a domain of its own).
func (n NodeInventory) Domain() string {
	for _, g := range n.GPUs {
		if g.Fabric != nil && g.Fabric.ClusterUUID != "" {
			return fmt.Sprintf("%s.%d", g.Fabric.ClusterUUID, g.Fabric.CliqueID)
		}
	}
	return n.Labels[CliqueLabel]
}

// NodeInventory is the document a reporter keeps in the inventory bucket,
// one per node id. Field names are fixed by the outside contract.
type NodeInventory struct {
	NodeID        string            `json:"node_id"`
	Hostname      string            `json:"hostname"`
	IP            string            `json:"ip"`
	CPUs          int               `json:"cpus"`
	MemoryBytes   uint64            `json:"memory_bytes"`
	GPUs          []GPU             `json:"gpus"`
	Labels        map[string]string `json:"labels,omitempty"`
	DriverVersion string            `json:"driver_version"`
	ReportedAt    time.Time         `json:"reported_at"`

	// CUDADriverVersion is the CUDA version the driver supports, as
	// "12.4"; empty without NVML.
	CUDADriverVersion string `json:"cuda_driver_version,omitempty"`
	// Reporter tells apart the reporter process that wrote the document
	// (random, new at each start): two reporters given one node id see
	// each other's writes by it.
	Reporter string `json:"reporter,omitempty"`
	// ReporterPID is the writing reporter's process id on its host
	// (hostname): a reporter that finds another's document for its node
	// names it, and on the same host takes over only from a pid no longer
	// running. 0 to MaxPID; 0 (absent) when unknown.
	ReporterPID int `json:"reporter_pid,omitempty"`
}

// Source produces a node's inventory: NVML on a GPU machine, a simulation
// elsewhere. The reporter asks it at start and whenever Changed fires.
type Source interface {
	// Inventory returns the node's inventory as of now. ReportedAt is left
	// for the caller to set, since only the caller knows when it reports.
	Inventory(ctx context.Context) (NodeInventory, error)
	// Changed delivers a value when the inventory may have changed (a GPU
	// turned unhealthy). A nil channel means it never changes.
	Changed() <-chan struct{}
}

// HealthyGPUs returns the GPUs the planner may place work on.
func (n NodeInventory) HealthyGPUs() []GPU {
	var out []GPU
	for _, g := range n.GPUs {
		if g.Healthy {
			out = append(out, g)
		}
	}
	return out
}

// SameInventory reports whether a and b describe the same node state,
// ignoring ReportedAt. The planner uses it to tell a heartbeat from a
// change, for every node on every replan, so it compares values
// (reflect.DeepEqual follows any field added later, as Fingerprint's
// canonical JSON does) rather than hashing: at a thousand nodes hashing
// cost 16 ms a replan.
func SameInventory(a, b NodeInventory) bool {
	return reflect.DeepEqual(canonical(a), canonical(b))
}

// canonical clears what SameInventory and Fingerprint ignore.
func canonical(n NodeInventory) NodeInventory {
	n.ReportedAt, n.Reporter, n.ReporterPID = time.Time{}, "", 0
	if len(n.GPUs) == 0 {
		n.GPUs = nil
	}
	if len(n.Labels) == 0 {
		n.Labels = nil
	}
	return n
}

// SameExceptProcesses says whether a and b differ in nothing but their
// GPUs' processes (and what SameInventory ignores): nothing a placement
// depends on.
func SameExceptProcesses(a, b NodeInventory) bool {
	return SameInventory(withoutProcesses(a), withoutProcesses(b))
}

func withoutProcesses(n NodeInventory) NodeInventory {
	if len(n.GPUs) == 0 {
		return n
	}
	gpus := make([]GPU, len(n.GPUs))
	copy(gpus, n.GPUs)
	for i := range gpus {
		gpus[i].Processes = nil
	}
	n.GPUs = gpus
	return n
}

// Fingerprint returns a short digest of n without ReportedAt: equal
// fingerprints mean equal inventories. A nil and an empty GPU list count
// as the same (both mean "no GPUs").
func Fingerprint(n NodeInventory) string {
	n = canonical(n)
	if n.GPUs == nil {
		n.GPUs = []GPU{}
	}
	// Marshalling plain data cannot fail; map keys come out sorted, so
	// the bytes are canonical.
	b, _ := json.Marshal(n)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
