package inventory

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// NodeIDRule is a node's id: 1 to 253 bytes of ASCII letters, digits
// and - _ = / and dots (a dot neither first, last nor next to another).
// A node id is the key of the inventory bucket and the last tokens of
// poolplanner.assignments.PLAN.NODE_ID (a dotted hostname is several
// tokens there: client.AssignmentNode takes the rest of the subject), so
// it holds only what KV keys allow and never makes an empty subject
// token; 253 bytes is a DNS name's longest, so every hostname passes.
var NodeIDRule = planner.NameRule{Kind: "node id", Max: 253, Punct: "-_=/", Dots: true, Err: ErrInvalidNodeID}

// ErrInvalidNodeID is ValidateNodeID's error.
var ErrInvalidNodeID = errors.New("invalid node id")

// ValidateNodeID checks id against NodeIDRule: every entry point of a
// node id (documents, the reporter's --node-id, lookups, offline
// inventories) checks it so. The error is ErrInvalidNodeID and names
// the length or the character that is wrong.
func ValidateNodeID(id string) error {
	return NodeIDRule.Check(id)
}

// Limits on one inventory document: far past any real node, so that a
// document past them is a bug or an attack, never a machine.
const (
	MaxGPUs   = 64
	MaxCPUs   = 4096
	MaxLabels = 256
	// MaxString bounds every string of a document.
	MaxString = 1024
	// MaxProcesses bounds the processes listed for one GPU.
	MaxProcesses = 64
	// MaxPID bounds reporter_pid: a process id fits 31 bits everywhere
	// (Linux allows at most 2^22).
	MaxPID = 1<<31 - 1
)

// Validate checks a document as the planner must before trusting it:
// an id following NodeIDRule, an IP address (or none), at most MaxGPUs
// GPUs with distinct indices 0..n-1 and distinct, non-empty UUIDs of
// printable ASCII without spaces, at
// most MaxCPUs CPUs (not negative), at most MaxLabels labels with keys
// following planner.LabelKeyRule, no string over MaxString bytes,
// NVLink peers and NUMA nodes in range, a reporter_pid of 0 to MaxPID. The error names the field and
// what is allowed.
//
// (A UUID another node's document holds is no error here: which node
// holds it depends on the others; Claims decides.)
func (n NodeInventory) Validate() error {
	if n.NodeID == "" {
		return errors.New("node_id: missing")
	}
	if err := ValidateNodeID(n.NodeID); err != nil {
		return fmt.Errorf("node_id: %w", err)
	}
	for _, f := range []struct{ name, v string }{{"node_id", n.NodeID}, {"hostname", n.Hostname}, {"ip", n.IP},
		{"driver_version", n.DriverVersion}, {"cuda_driver_version", n.CUDADriverVersion}, {"reporter", n.Reporter}} {
		if len(f.v) > MaxString {
			return fmt.Errorf("%s: %d bytes; at most %d", f.name, len(f.v), MaxString)
		}
	}
	if n.ReporterPID < 0 || n.ReporterPID > MaxPID {
		return fmt.Errorf("reporter_pid: %d is not allowed; want 0 to %d", n.ReporterPID, MaxPID)
	}
	if n.IP != "" && net.ParseIP(n.IP) == nil {
		return fmt.Errorf("ip: %q is not an IP address", n.IP)
	}
	if n.CPUs < 0 || n.CPUs > MaxCPUs {
		return fmt.Errorf("cpus: %d is not allowed; want 0 to %d", n.CPUs, MaxCPUs)
	}
	if len(n.GPUs) > MaxGPUs {
		return fmt.Errorf("gpus: %d GPUs is not allowed; want at most %d", len(n.GPUs), MaxGPUs)
	}
	if len(n.Labels) > MaxLabels {
		return fmt.Errorf("labels: %d labels; at most %d", len(n.Labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		if err := planner.LabelKeyRule.Check(k); err != nil {
			return fmt.Errorf("labels: %w", err)
		}
		if v := n.Labels[k]; len(v) > MaxString {
			return fmt.Errorf("labels.%s: a value of %d bytes; at most %d", k, len(v), MaxString)
		}
	}
	seenIndex := make([]bool, len(n.GPUs))
	seenUUID := map[string]bool{}
	for i, g := range n.GPUs {
		if err := g.validate(len(n.GPUs)); err != nil {
			return fmt.Errorf("gpus[%d].%w", i, err)
		}
		if seenIndex[g.Index] {
			return fmt.Errorf("gpus[%d].index: %d appears twice; want distinct indices 0..%d", i, g.Index, len(n.GPUs)-1)
		}
		seenIndex[g.Index] = true
		if seenUUID[g.UUID] {
			return fmt.Errorf("gpus[%d].uuid: %q appears twice", i, clip(g.UUID, listedName))
		}
		seenUUID[g.UUID] = true
	}
	return nil
}

// validate checks one GPU of a node of count GPUs.
func (g GPU) validate(count int) error {
	if g.Index < 0 || g.Index >= count {
		return fmt.Errorf("index: %d is not allowed; want 0..%d", g.Index, count-1)
	}
	if g.UUID == "" {
		return errors.New("uuid: missing; every GPU is named by its UUID (NVML's, or one a simulation or the reporter makes up for a GPU NVML cannot name)")
	}
	for _, f := range []struct{ name, v string }{{"uuid", g.UUID}, {"name", g.Name}, {"pci_bus_id", g.PCIBusID}, {"unhealthy_reason", g.UnhealthyReason}} {
		if len(f.v) > MaxString {
			return fmt.Errorf("%s: %d bytes; at most %d", f.name, len(f.v), MaxString)
		}
	}
	// UUIDs are keys in plans, headers, CUDA_VISIBLE_DEVICES and lines
	// people read: NVML's (GPU-…, MIG-…) are printable ASCII, and a
	// space, control or other character in one is an attack or a bug.
	if i := strings.IndexFunc(g.UUID, func(r rune) bool { return r <= ' ' || r > '~' }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(g.UUID[i:])
		return fmt.Errorf("uuid: %q at byte %d is not allowed; want printable ASCII without spaces (NVML's GPU-… or MIG-…)", r, i)
	}
	if len(g.Processes) > MaxProcesses {
		return fmt.Errorf("processes: %d listed; at most %d", len(g.Processes), MaxProcesses)
	}
	for i, p := range g.Processes {
		if len(p.Name) > MaxString {
			return fmt.Errorf("processes[%d].name: %d bytes; at most %d", i, len(p.Name), MaxString)
		}
	}
	if g.NUMANode != nil && (*g.NUMANode < 0 || *g.NUMANode > MaxCPUs) {
		return fmt.Errorf("numa_node: %d is not allowed; want 0 to %d", *g.NUMANode, MaxCPUs)
	}
	if len(g.NVLinkPeers) > count {
		return fmt.Errorf("nvlink_peers: %d listed; at most %d, other GPUs' indices 0..%d", len(g.NVLinkPeers), count-1, count-1)
	}
	if i := slices.IndexFunc(g.NVLinkPeers, func(p int) bool { return p < 0 || p >= count || p == g.Index }); i >= 0 {
		return fmt.Errorf("nvlink_peers[%d]: %d is not allowed; want another GPU's index 0..%d", i, g.NVLinkPeers[i], count-1)
	}
	if g.Fabric != nil && (g.Fabric.ClusterUUID == "" || len(g.Fabric.ClusterUUID) > 64) {
		return fmt.Errorf("fabric.cluster_uuid: %d bytes is not allowed; want a UUID of at most 64", len(g.Fabric.ClusterUUID))
	}
	return nil
}
