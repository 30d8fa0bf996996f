package inventory

import (
	"context"
	"crypto/sha256"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// GiB is 2^30 bytes.
const GiB = 1 << 30

// Model is one GPU model as NVML names it: the single table that
// simulation and test fakes share, so a simulated H100 and a faked one
// look the same to the planner.
type Model struct {
	// Key is the short name used in --simulate ("H100").
	Key string
	// Name is what NVML's nvmlDeviceGetName returns.
	Name string
	// MemoryBytes is the total framebuffer memory NVML reports.
	MemoryBytes uint64
	// NVLink is true for SXM parts, whose GPUs all reach each other over
	// NVSwitch; simulated nodes of such models get full NVLink peer sets.
	NVLink bool
	// DomainNodes, for a rack-scale part, is how many nodes share one
	// NVLink domain (serve --simulate puts them in one by the
	// nvidia.com/gpu.clique label); 0 for others.
	DomainNodes int
}

// models lists the GPU models --simulate knows, by key. Memory is what
// NVML reports for the part (slightly under the marketing figure).
var models = []Model{
	{Key: "A10", Name: "NVIDIA A10", MemoryBytes: 23028 << 20},
	{Key: "A100", Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 81920 << 20, NVLink: true},
	{Key: "A100-40GB", Name: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40960 << 20, NVLink: true},
	{Key: "B200", Name: "NVIDIA B200", MemoryBytes: 183359 << 20, NVLink: true},
	// GB200 NVL72: 4 GPUs a node, 18 nodes an NVLink domain (a rack).
	{Key: "GB200", Name: "NVIDIA GB200", MemoryBytes: 189471 << 20, NVLink: true, DomainNodes: 18},
	{Key: "H100", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 << 20, NVLink: true},
	{Key: "H200", Name: "NVIDIA H200", MemoryBytes: 143771 << 20, NVLink: true},
	{Key: "L4", Name: "NVIDIA L4", MemoryBytes: 23034 << 20},
	{Key: "L40S", Name: "NVIDIA L40S", MemoryBytes: 46068 << 20},
	{Key: "T4", Name: "Tesla T4", MemoryBytes: 15360 << 20},
}

// Models returns the known GPU models, sorted by key.
func Models() []Model {
	return append([]Model(nil), models...)
}

// LookupModel finds a model by key, ignoring case.
func LookupModel(key string) (Model, bool) {
	for _, m := range models {
		if strings.EqualFold(m.Key, key) {
			return m, true
		}
	}
	return Model{}, false
}

// MaxSimulatedGPUs bounds --simulate: no real node has more, and a typo
// like 800xH100 should fail loudly rather than build a huge document.
const MaxSimulatedGPUs = 64

// Simulation is a parsed --simulate value: Count GPUs of Model.
type Simulation struct {
	Count int
	Model Model
}

// String returns the canonical form, "8xH100".
func (s Simulation) String() string {
	return fmt.Sprintf("%dx%s", s.Count, s.Model.Key)
}

var simRE = regexp.MustCompile(`^([0-9]+)[xX](.+)$`)

// ParseSimulation parses "NxMODEL" (8xH100, 4xA100, 8xh200).
func ParseSimulation(s string) (Simulation, error) {
	m := simRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Simulation{}, fmt.Errorf("%q: want NxMODEL, e.g. 8xH100", s)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 || n > MaxSimulatedGPUs {
		return Simulation{}, fmt.Errorf("%q: GPU count must be 1 to %d", s, MaxSimulatedGPUs)
	}
	model, ok := LookupModel(m[2])
	if !ok {
		keys := make([]string, len(models))
		for i, mm := range models {
			keys[i] = mm.Key
		}
		return Simulation{}, fmt.Errorf("%q: unknown GPU model %q (known: %s)", s, m[2], strings.Join(keys, ", "))
	}
	return Simulation{Count: n, Model: model}, nil
}

// SimulatedUUID derives a GPU UUID from the node id and index, so a
// simulated node reports the same UUIDs on every run. It is formatted like
// NVML's ("GPU-" and a version-4-shaped UUID) so nothing downstream can
// tell it apart.
func SimulatedUUID(nodeID string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("poolplanner-sim/%s/%d", nodeID, index)))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// dgxBuses are the PCI buses of the eight GPUs of a DGX H100, so that
// simulated bus ids look like real ones.
var dgxBuses = [8]int{0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB}

// SimulatedGPUs returns the GPUs of a simulated node, all healthy, with
// PCI bus ids laid out as on a DGX (two NUMA nodes, half the GPUs each).
func SimulatedGPUs(nodeID string, sim Simulation) []GPU {
	gpus := make([]GPU, sim.Count)
	for i := range gpus {
		numa := i * 2 / sim.Count
		gpus[i] = GPU{
			Index:       i,
			UUID:        SimulatedUUID(nodeID, i),
			Name:        sim.Model.Name,
			MemoryBytes: sim.Model.MemoryBytes,
			PCIBusID:    fmt.Sprintf("%08X:%02X:00.0", i/len(dgxBuses), dgxBuses[i%len(dgxBuses)]),
			Healthy:     true,
			NUMANode:    &numa,
		}
		if sim.Model.NVLink {
			for j := range sim.Count {
				if j != i {
					gpus[i].NVLinkPeers = append(gpus[i].NVLinkPeers, j)
				}
			}
		}
	}
	return gpus
}

// Simulated is a Source of a node with simulated GPUs and real (or given)
// node facts. Its inventory never changes.
type Simulated struct {
	facts Facts
	sim   Simulation
}

// NewSimulated returns a Source for facts plus sim's GPUs.
func NewSimulated(facts Facts, sim Simulation) *Simulated {
	return &Simulated{facts: facts, sim: sim}
}

// Inventory implements Source.
func (s *Simulated) Inventory(context.Context) (NodeInventory, error) {
	inv := s.facts.Inventory()
	inv.GPUs = SimulatedGPUs(s.facts.NodeID, s.sim)
	inv.DriverVersion = "simulated"
	return inv, nil
}

// Changed implements Source; a simulation never changes.
func (s *Simulated) Changed() <-chan struct{} { return nil }
