package inventory

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
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
	// HostCPUs and HostMemoryBytes are the host such GPUs come in (a DGX
	// for SXM parts, a GB200 compute tray, a typical 2U server for PCIe
	// cards): a simulated node is a whole node, so that a spec sized for
	// real nodes fits simulated ones.
	HostCPUs        int
	HostMemoryBytes uint64
}

// Hosts of simulated nodes.
const (
	dgxCPUs, dgxMemory       = 224, 2 << 40   // DGX H100/H200 (and B200, with 4 TiB): 2 x 56 cores, 2 threads each; 2 TiB
	dgxA100CPUs, dgxA100Mem  = 256, 1 << 40   // DGX A100: 2 x 64 cores; 1 TiB
	gb200CPUs, gb200Memory   = 144, 960 << 30 // GB200 tray: 2 Grace of 72 cores; 960 GiB LPDDR5X
	serverCPUs, serverMemory = 64, 512 << 30  // a 2U PCIe server: 2 x 16 cores, 2 threads each; 512 GiB
)

// Host is facts with the simulated model's host CPUs and memory: a
// simulated node is a whole node.
func (s Simulation) Host(f Facts) Facts {
	f.CPUs, f.MemoryBytes = s.Model.HostCPUs, s.Model.HostMemoryBytes
	return f
}

// models lists the GPU models --simulate knows, by key. Memory is what
// NVML reports for the part (slightly under the marketing figure).
var models = []Model{
	{Key: "A10", Name: "NVIDIA A10", MemoryBytes: 23028 << 20, HostCPUs: serverCPUs, HostMemoryBytes: serverMemory},
	{Key: "A100", Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 81920 << 20, NVLink: true, HostCPUs: dgxA100CPUs, HostMemoryBytes: dgxA100Mem},
	{Key: "A100-40GB", Name: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40960 << 20, NVLink: true, HostCPUs: dgxA100CPUs, HostMemoryBytes: dgxA100Mem},
	{Key: "B200", Name: "NVIDIA B200", MemoryBytes: 183359 << 20, NVLink: true, HostCPUs: dgxCPUs, HostMemoryBytes: 4 << 40},
	// GB200 NVL72: 4 GPUs a node, 18 nodes an NVLink domain (a rack).
	{Key: "GB200", Name: "NVIDIA GB200", MemoryBytes: 189471 << 20, NVLink: true, DomainNodes: 18, HostCPUs: gb200CPUs, HostMemoryBytes: gb200Memory},
	{Key: "H100", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 << 20, NVLink: true, HostCPUs: dgxCPUs, HostMemoryBytes: dgxMemory},
	{Key: "H200", Name: "NVIDIA H200", MemoryBytes: 143771 << 20, NVLink: true, HostCPUs: dgxCPUs, HostMemoryBytes: dgxMemory},
	{Key: "L4", Name: "NVIDIA L4", MemoryBytes: 23034 << 20, HostCPUs: serverCPUs, HostMemoryBytes: serverMemory},
	{Key: "L40S", Name: "NVIDIA L40S", MemoryBytes: 46068 << 20, HostCPUs: serverCPUs, HostMemoryBytes: serverMemory},
	{Key: "T4", Name: "Tesla T4", MemoryBytes: 15360 << 20, HostCPUs: serverCPUs, HostMemoryBytes: serverMemory},
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
// node facts. Its inventory changes only when SetBusy says.
type Simulated struct {
	facts   Facts
	sim     Simulation
	changed chan struct{}

	mu   sync.Mutex
	busy []int // GPU indices running a simulated process
	// sick are the GPUs an injected XID marked unhealthy, by index.
	sick map[int]healthMark
}

// NewSimulated returns a Source for facts plus sim's GPUs.
func NewSimulated(facts Facts, sim Simulation) *Simulated {
	return &Simulated{facts: facts, sim: sim, changed: make(chan struct{}, 1)}
}

// SimulatedProcess is what runs on a simulated busy GPU: pid 0, which
// no real process has.
var SimulatedProcess = Process{PID: 0, Name: "simulated"}

// SetBusy makes the GPUs of these indices run SimulatedProcess (and the
// others none), as a reporter's --busy says or a test needs; the
// inventory changes at once. An index past the node's GPUs is an error.
func (s *Simulated) SetBusy(indices []int) error {
	for _, i := range indices {
		if i < 0 || i >= s.sim.Count {
			return fmt.Errorf("--busy %d: the node has GPUs 0 to %d", i, s.sim.Count-1)
		}
	}
	s.mu.Lock()
	s.busy = slices.Clone(indices)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// Inventory implements Source.
func (s *Simulated) Inventory(context.Context) (NodeInventory, error) {
	inv := s.facts.Inventory()
	inv.GPUs = SimulatedGPUs(s.facts.NodeID, s.sim)
	inv.DriverVersion = "simulated"
	s.mu.Lock()
	for _, i := range s.busy {
		inv.GPUs[i].Processes = []Process{SimulatedProcess}
	}
	for i, m := range s.sick {
		inv.GPUs[i].Healthy, inv.GPUs[i].UnhealthyReason = false, m.reason
	}
	s.mu.Unlock()
	return inv, nil
}

// Changed implements Source: it fires when SetBusy changes the GPUs'
// processes.
func (s *Simulated) Changed() <-chan struct{} { return s.changed }

// InjectXID has GPU x.GPU throw XID x.Code now, classed as NVML's
// source classes it (ClassifyXID): an application's leaves the GPU
// healthy; one a reset resolves marks it unhealthy until the next
// health check at least every later (a simulated GPU is clean after its
// reset); any other until the source is made again (the reporter
// restarts). It reports whether the GPU's health changed.
func (s *Simulated) InjectXID(x XIDInjection, now time.Time) bool {
	if x.GPU < 0 || x.GPU >= s.sim.Count {
		return false
	}
	action := ClassifyXID(x.Code)
	if action == XIDIgnore {
		return false
	}
	s.mu.Lock()
	old, had := s.sick[x.GPU]
	if !had || old.recoverable && action != XIDReset {
		if s.sick == nil {
			s.sick = map[int]healthMark{}
		}
		s.sick[x.GPU] = healthMark{reason: fmt.Sprintf("XID %d (%s)", x.Code, resolution(action)), recoverable: action == XIDReset, at: now}
	}
	s.mu.Unlock()
	if !had {
		s.signal()
	}
	return !had
}

// RecheckHealth clears the marks of XIDs a reset resolves made at least
// every before now, as NVML's source does once the GPU is clean.
func (s *Simulated) RecheckHealth(now time.Time, every time.Duration) bool {
	s.mu.Lock()
	cleared := false
	for i, m := range s.sick {
		if m.recoverable && now.Sub(m.at) >= every {
			delete(s.sick, i)
			cleared = true
		}
	}
	s.mu.Unlock()
	if cleared {
		s.signal()
	}
	return cleared
}

func (s *Simulated) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// RunXIDs injects each XID when its delay has passed, and checks the
// GPUs' health again every every (DefaultHealthEvery when not above
// zero), until ctx ends.
func (s *Simulated) RunXIDs(ctx context.Context, xids []XIDInjection, every time.Duration) {
	if every <= 0 {
		every = DefaultHealthEvery
	}
	start := time.Now()
	pending := slices.Clone(xids)
	slices.SortStableFunc(pending, func(a, b XIDInjection) int { return cmp.Compare(a.After, b.After) })
	check := time.NewTicker(every)
	defer check.Stop()
	next := time.NewTimer(time.Hour)
	defer next.Stop()
	arm := func() {
		next.Stop()
		if len(pending) > 0 {
			next.Reset(max(0, pending[0].After-time.Since(start)))
		}
	}
	arm()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-check.C:
			s.RecheckHealth(now, every)
		case now := <-next.C:
			s.InjectXID(pending[0], now)
			pending = pending[1:]
			arm()
		}
	}
}
