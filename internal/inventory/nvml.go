//go:build cgo

package inventory

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// NVMLError is a failed NVML call, naming the call.
type NVMLError struct {
	Call   string
	Return nvml.Return
}

func (e *NVMLError) Error() string {
	return fmt.Sprintf("nvml %s: %s", e.Call, nvml.ErrorString(e.Return))
}

// Unwrap lets callers test for a particular code with errors.Is, e.g.
// errors.Is(err, nvml.ERROR_GPU_IS_LOST).
func (e *NVMLError) Unwrap() error { return e.Return }

// NVML is a Source that reads the GPUs through NVML. It is safe for
// concurrent use: WatchHealth runs beside Inventory calls.
type NVML struct {
	lib   nvml.Interface
	facts Facts
	sysfs string
	// proc is where process names are read (/proc; tests point it
	// elsewhere).
	proc    string
	log     zerolog.Logger
	ignored map[uint64]bool
	changed chan struct{}
	waitMs  uint32 // one event wait; tests shorten it
	// healthEvery is how often marks a reset resolves are checked again
	// (NVMLOptions.HealthEvery); now, the clock that check goes by.
	healthEvery time.Duration
	now         func() time.Time

	mu sync.Mutex
	// unhealthy maps a GPU UUID to why it was marked unhealthy. A mark
	// for an XID that restarting the application or resetting the GPU
	// resolves (XIDReset) lasts until NVML reports the GPU clean again;
	// any other lasts until the reporter restarts, as in the NVIDIA
	// device plugin: such a GPU needs a reboot or an operator.
	unhealthy map[string]healthMark
}

// OpenNVML initialises lib (nvml.New() in production, a mock in tests).
// It returns ErrNoNVML when the library is missing, and an *NVMLError for
// any other Init failure.
func OpenNVML(lib nvml.Interface, opts NVMLOptions) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, ErrNoNVML
		}
		return nil, &NVMLError{Call: "Init", Return: ret}
	}
	ignored := opts.IgnoredXIDs
	n := &NVML{
		lib:       lib,
		facts:     opts.Facts,
		sysfs:     opts.SysfsRoot,
		log:       opts.Log,
		ignored:   make(map[uint64]bool, len(ignored)),
		changed:   make(chan struct{}, 1),
		waitMs:    healthWaitMs,
		unhealthy: make(map[string]healthMark),
		now:       time.Now,
	}
	n.healthEvery = opts.HealthEvery
	if n.healthEvery <= 0 {
		n.healthEvery = DefaultHealthEvery
	}
	if n.sysfs == "" {
		n.sysfs = "/sys"
	}
	n.proc = "/proc"
	if ignored == nil {
		n.ignored = nil // the catalog's classes (ClassifyXID)
	}
	for _, x := range ignored {
		n.ignored[x] = true
	}
	return n, nil
}

// Close shuts NVML down.
func (n *NVML) Close() error {
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return &NVMLError{Call: "Shutdown", Return: ret}
	}
	return nil
}

// Changed implements Source: it fires when a GPU is marked unhealthy.
func (n *NVML) Changed() <-chan struct{} { return n.changed }

// MarkUnhealthy records that the GPU with uuid must not be used, and
// signals Changed if that is news.
func (n *NVML) MarkUnhealthy(uuid, reason string) { n.mark(uuid, reason, false) }

// mark records that the GPU with uuid must not be used, recoverable or
// not, and signals Changed if that is news. A mark that only a reboot
// clears is not made recoverable by a later one.
func (n *NVML) mark(uuid, reason string, recoverable bool) {
	n.mu.Lock()
	old, had := n.unhealthy[uuid]
	if !had || old.recoverable && !recoverable {
		n.unhealthy[uuid] = healthMark{reason: reason, recoverable: recoverable, at: n.now()}
	}
	n.mu.Unlock()
	if had {
		return
	}
	n.log.Warn().Str("gpu", uuid).Str("reason", reason).Msg("GPU marked unhealthy")
	n.signal()
}

// signal fires Changed.
func (n *NVML) signal() {
	select {
	case n.changed <- struct{}{}:
	default: // a signal is already pending; the reader re-reads everything
	}
}

// Inventory implements Source. Only a failure to count the GPUs fails the
// report; a call that is not supported leaves its field empty, and any
// other failed call leaves its field empty with a warning, or marks the
// GPU unhealthy when it cannot even be identified.
func (n *NVML) Inventory(ctx context.Context) (NodeInventory, error) {
	inv := n.facts.Inventory()
	if v, ret := n.lib.SystemGetDriverVersion(); n.ok("SystemGetDriverVersion", ret) {
		inv.DriverVersion = v
	}
	if v, ret := n.lib.SystemGetCudaDriverVersion(); n.ok("SystemGetCudaDriverVersion", ret) {
		// NVML encodes 12.4 as 12040.
		inv.CUDADriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}

	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return NodeInventory{}, &NVMLError{Call: "DeviceGetCount", Return: ret}
	}
	devices := make([]nvml.Device, count)
	inv.GPUs = make([]GPU, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return NodeInventory{}, err
		}
		inv.GPUs[i] = GPU{Index: i, Healthy: true}
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			n.unusable(&inv.GPUs[i], &NVMLError{Call: "DeviceGetHandleByIndex", Return: ret})
			continue
		}
		devices[i] = d
		n.describe(d, &inv.GPUs[i])
	}
	n.nvlinkPeers(devices, inv.GPUs)
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == "" {
			// Marked unusable above; a document names every GPU.
			inv.GPUs[i].UUID = UnnamedUUID(inv.NodeID, i)
		}
	}

	n.mu.Lock()
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if m, bad := n.unhealthy[g.UUID]; bad && g.UUID != "" {
			g.Healthy, g.UnhealthyReason = false, m.reason
		}
	}
	n.mu.Unlock()
	return inv, nil
}

// describe fills g from d.
func (n *NVML) describe(d nvml.Device, g *GPU) {
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		// Without a UUID nothing downstream can name the GPU; keep it in
		// the list (the indices must stay dense) but never place on it.
		n.unusable(g, &NVMLError{Call: "DeviceGetUUID", Return: ret})
		return
	}
	g.UUID = uuid
	// A GPU that fell off the bus answers every call with GPU_IS_LOST;
	// that is a health verdict, not a missing field.
	var lost *NVMLError
	ok := func(call string, ret nvml.Return) bool {
		if ret == nvml.ERROR_GPU_IS_LOST && lost == nil {
			lost = &NVMLError{Call: call, Return: ret}
		}
		return n.ok(call, ret)
	}
	if name, ret := d.GetName(); ok("DeviceGetName", ret) {
		g.Name = name
	}
	if mem, ret := d.GetMemoryInfo(); ok("DeviceGetMemoryInfo", ret) {
		g.MemoryBytes = mem.Total
	}
	if pci, ret := d.GetPciInfo(); ok("DeviceGetPciInfo", ret) {
		g.PCIBusID = cString(pci.BusId[:])
	}
	if numa, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMANode = &numa
	} else if ret != nvml.ERROR_GPU_IS_LOST {
		// NVML only knows NUMA affinity on some platforms; the kernel
		// knows it for every PCI device.
		ok("DeviceGetNumaNodeId", ret)
		g.NUMANode = n.sysfsNUMA(g.PCIBusID)
	} else {
		ok("DeviceGetNumaNodeId", ret)
	}
	if cur, _, ret := d.GetMigMode(); ok("DeviceGetMigMode", ret) {
		g.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
	}
	g.Fabric = n.fabric(d)
	g.Processes = n.processes(d)
	if lost != nil {
		n.unusable(g, lost)
	}
}

// fabric is d's NVLink fabric clique, nil where it has none: GPUs
// before GB200 answer NOT_SUPPORTED (older drivers lack the call), and a
// GPU whose fabric manager has not registered it yet has no clique to
// report (the next scan will).
func (n *NVML) fabric(d nvml.Device) *Fabric {
	// The v1 call: the versioned one cannot be mocked (its handler wraps
	// an unexported device), and v1 carries all that is read here.
	info, ret := d.GetGpuFabricInfo()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND:
		return nil
	case !n.ok("DeviceGetGpuFabricInfo", ret):
		return nil
	case info.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(info.Status) != nvml.SUCCESS:
		return nil
	}
	var zero [16]uint8
	if info.ClusterUuid == zero {
		return nil
	}
	u := info.ClusterUuid
	return &Fabric{ClusterUUID: fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), CliqueID: info.CliqueId}
}

// nvlinkPeers records, for each pair of GPUs, whether NVML reports an
// NVLink P2P path between them.
func (n *NVML) nvlinkPeers(devices []nvml.Device, gpus []GPU) {
	for i := range devices {
		for j := i + 1; j < len(devices); j++ {
			if devices[i] == nil || devices[j] == nil {
				continue
			}
			st, ret := devices[i].GetP2PStatus(devices[j], nvml.P2P_CAPS_INDEX_NVLINK)
			if !n.ok("DeviceGetP2PStatus", ret) || st != nvml.P2P_STATUS_OK {
				continue
			}
			gpus[i].NVLinkPeers = append(gpus[i].NVLinkPeers, j)
			gpus[j].NVLinkPeers = append(gpus[j].NVLinkPeers, i)
		}
	}
}

// sysfsNUMA reads /sys/bus/pci/devices/BUSID/numa_node; nil when unknown.
func (n *NVML) sysfsNUMA(busID string) *int {
	if busID == "" {
		return nil
	}
	// NVML writes an 8-digit domain ("00000000:18:00.0"), sysfs a 4-digit
	// one ("0000:18:00.0"), lower case.
	id := strings.ToLower(busID)
	if len(id) == 16 {
		id = id[4:]
	}
	b, err := os.ReadFile(filepath.Join(n.sysfs, "bus", "pci", "devices", id, "numa_node"))
	if err != nil {
		return nil
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < 0 { // -1: the platform has no NUMA affinity
		return nil
	}
	return &v
}

// ok reports whether ret is SUCCESS. NOT_SUPPORTED is silent; any other
// failure is logged, since it leaves a field empty that should not be.
func (n *NVML) ok(call string, ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_NOT_SUPPORTED:
		return false
	default:
		n.log.Warn().Str("call", call).Str("error", nvml.ErrorString(ret)).Msg("NVML call failed; field left empty")
		return false
	}
}

func (n *NVML) unusable(g *GPU, err error) {
	n.log.Warn().Int("gpu_index", g.Index).Err(err).Msg("GPU unusable")
	g.Healthy, g.UnhealthyReason = false, err.Error()
}

// cString converts a NUL-padded C char array to a string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
