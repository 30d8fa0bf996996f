//go:build cgo

package inventory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/rs/zerolog"
)

// machine is a go-nvml mock server completed with the calls the mock
// lacks (NUMA, P2P, PCI bus id, events), behaving like a DGX: GPUs 0-3 on
// NUMA node 0, 4-7 on node 1, all pairs NVLinked, and an event set fed
// from a channel.
type machine struct {
	*server.Server
	events chan nvml.EventData
	mu     sync.Mutex
	// compute and graphics are the processes each GPU lists.
	compute, graphics map[int][]nvml.ProcessInfo
}

// run sets the processes GPU i lists.
func (m *machine) run(i int, compute, graphics []nvml.ProcessInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.compute[i], m.graphics[i] = compute, graphics
}

func newMachine(s *server.Server) *machine {
	m := &machine{Server: s, events: make(chan nvml.EventData, 8), compute: map[int][]nvml.ProcessInfo{}, graphics: map[int][]nvml.ProcessInfo{}}
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.compute[i], nvml.SUCCESS
		}
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.graphics[i], nvml.SUCCESS
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
		dev.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			// NVML pads the bus id with NULs to 32 bytes.
			for j, c := range []byte("0000" + strings.ToUpper(dev.PciBusID)) {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		// Hopper GPUs have no multi-node NVLink fabric.
		dev.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) { return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED }
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-m.events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
		}, nvml.SUCCESS
	}
	return m
}

func (m *machine) device(i int) *server.Device { return m.Devices[i].(*server.Device) }

func openNVML(t *testing.T, lib nvml.Interface, opts NVMLOptions) *NVML {
	t.Helper()
	opts.Facts = Facts{NodeID: "n1", Hostname: "dgx", IP: "10.0.0.1", CPUs: 224}
	opts.Log = zerolog.New(zerolog.NewTestWriter(t))
	n, err := OpenNVML(lib, opts)
	if err != nil {
		t.Fatalf("OpenNVML: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	n.waitMs = 20
	return n
}

func inventoryOf(t *testing.T, n *NVML) NodeInventory {
	t.Helper()
	inv, err := n.Inventory(context.Background())
	if err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	return inv
}

func TestNVMLDiscovery(t *testing.T) {
	tests := []struct {
		name     string
		server   *server.Server
		gpuName  string
		memoryMB uint64
	}{
		{name: "dgxh100", server: dgxh100.New(), gpuName: "NVIDIA H100 80GB HBM3", memoryMB: 81920},
		{name: "dgxh200", server: dgxh200.New(), gpuName: "NVIDIA H200 141GB HBM3e", memoryMB: 144384},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMachine(tt.server)
			inv := inventoryOf(t, openNVML(t, m, NVMLOptions{}))
			if inv.NodeID != "n1" || inv.DriverVersion != "550.54.15" || inv.CUDADriverVersion != "12.4" {
				t.Errorf("node = %s driver %q cuda %q", inv.NodeID, inv.DriverVersion, inv.CUDADriverVersion)
			}
			if len(inv.GPUs) != 8 {
				t.Fatalf("got %d GPUs, want 8", len(inv.GPUs))
			}
			uuids := map[string]bool{}
			for i, g := range inv.GPUs {
				uuids[g.UUID] = true
				dev := m.device(i)
				if g.Index != i || g.UUID != dev.UUID || !g.Healthy {
					t.Errorf("gpu %d = %+v", i, g)
				}
				if !strings.HasPrefix(g.Name, strings.Fields(tt.gpuName)[0]) || g.MemoryBytes != tt.memoryMB<<20 {
					t.Errorf("gpu %d name %q memory %d, want %q %d MiB", i, g.Name, g.MemoryBytes, tt.gpuName, tt.memoryMB)
				}
				if want := "0000" + strings.ToUpper(dev.PciBusID); g.PCIBusID != want {
					t.Errorf("gpu %d pci bus id %q, want %q (NULs trimmed)", i, g.PCIBusID, want)
				}
				if g.NUMANode == nil || *g.NUMANode != i/4 {
					t.Errorf("gpu %d numa node %v, want %d", i, g.NUMANode, i/4)
				}
				if len(g.NVLinkPeers) != 7 || g.MIGEnabled {
					t.Errorf("gpu %d nvlink peers %v mig %v", i, g.NVLinkPeers, g.MIGEnabled)
				}
			}
			if len(uuids) != 8 {
				t.Errorf("got %d distinct UUIDs, want 8", len(uuids))
			}
		})
	}
}

func TestNVMLMIGMode(t *testing.T) {
	m := newMachine(dgxh100.New())
	m.device(3).SetMigMode(nvml.DEVICE_MIG_ENABLE)
	inv := inventoryOf(t, openNVML(t, m, NVMLOptions{}))
	for i, g := range inv.GPUs {
		if g.MIGEnabled != (i == 3) {
			t.Errorf("gpu %d mig_enabled = %v", i, g.MIGEnabled)
		}
	}
}

func TestNVMLNotSupportedLeavesFieldsEmpty(t *testing.T) {
	m := newMachine(dgxh100.New())
	notSupported := func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	sysfs := t.TempDir()
	for i := range m.Devices {
		dev := m.device(i)
		dev.GetNumaNodeIdFunc = notSupported
		dev.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
		// sysfs knows GPUs 0 and 1; 1 says -1 (no affinity).
		if i < 2 {
			dir := filepath.Join(sysfs, "bus", "pci", "devices", "0000:"+dev.PciBusID[5:])
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, "numa_node"), []byte([]string{"1\n", "-1\n"}[i]), 0o644)
		}
	}
	m.SystemGetCudaDriverVersionFunc = notSupported
	inv := inventoryOf(t, openNVML(t, m, NVMLOptions{SysfsRoot: sysfs}))
	if inv.CUDADriverVersion != "" {
		t.Errorf("cuda version %q, want empty", inv.CUDADriverVersion)
	}
	for i, g := range inv.GPUs {
		if !g.Healthy || g.NVLinkPeers != nil || g.MIGEnabled {
			t.Errorf("gpu %d = %+v", i, g)
		}
		if i == 0 {
			if g.NUMANode == nil || *g.NUMANode != 1 {
				t.Errorf("gpu 0 numa %v, want 1 from sysfs", g.NUMANode)
			}
		} else if g.NUMANode != nil {
			t.Errorf("gpu %d numa %d, want empty", i, *g.NUMANode)
		}
	}
}

func TestNVMLLibraryMissing(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	if _, err := OpenNVML(lib, NVMLOptions{}); !errors.Is(err, ErrNoNVML) {
		t.Errorf("OpenNVML with no library: %v, want ErrNoNVML", err)
	}
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	var nerr *NVMLError
	if _, err := OpenNVML(lib, NVMLOptions{}); !errors.As(err, &nerr) || nerr.Call != "Init" {
		t.Errorf("OpenNVML with no driver: %v, want an Init NVMLError", err)
	}
	// The real library: on machines without a GPU driver (CI, laptops)
	// this is the path the reporter takes.
	if n, err := OpenNVML(nvml.New(), NVMLOptions{}); err == nil {
		n.Close()
		t.Skip("this machine has NVML")
	} else if !errors.Is(err, ErrNoNVML) {
		t.Logf("real NVML: %v", err)
	}
}

func TestNVMLCallFailing(t *testing.T) {
	t.Run("device count fails the report", func(t *testing.T) {
		m := newMachine(dgxh100.New())
		m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		_, err := openNVML(t, m, NVMLOptions{}).Inventory(context.Background())
		var nerr *NVMLError
		if !errors.As(err, &nerr) || nerr.Call != "DeviceGetCount" {
			t.Errorf("Inventory: %v, want a DeviceGetCount NVMLError", err)
		}
	})
	t.Run("per-GPU failures", func(t *testing.T) {
		m := newMachine(dgxh100.New())
		m.device(1).GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		m.device(2).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		m.device(3).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
		handle := m.DeviceGetHandleByIndexFunc
		m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
			if i == 4 {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return handle(i)
		}
		m.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		inv := inventoryOf(t, openNVML(t, m, NVMLOptions{}))
		if len(inv.GPUs) != 8 || inv.DriverVersion != "" {
			t.Fatalf("got %d GPUs, driver %q", len(inv.GPUs), inv.DriverVersion)
		}
		tests := []struct {
			index   int
			healthy bool
			reason  string
		}{
			{index: 0, healthy: true},
			{index: 1, healthy: true}, // a missing name is no health problem
			{index: 2, reason: "nvml DeviceGetUUID: "},
			{index: 3, reason: "nvml DeviceGetMemoryInfo: "},
			{index: 4, reason: "nvml DeviceGetHandleByIndex: "},
		}
		for _, tt := range tests {
			g := inv.GPUs[tt.index]
			if g.Index != tt.index || g.Healthy != tt.healthy || !strings.HasPrefix(g.UnhealthyReason, tt.reason) {
				t.Errorf("gpu %d healthy %v reason %q, want %v %q", tt.index, g.Healthy, g.UnhealthyReason, tt.healthy, tt.reason)
			}
		}
		if inv.GPUs[1].Name != "" || inv.GPUs[1].UUID == "" {
			t.Errorf("gpu 1 = %+v, want a UUID and no name", inv.GPUs[1])
		}
		// The GPUs NVML cannot name get a UUID of their own: documents
		// name every GPU (Validate).
		for _, i := range []int{2, 4} {
			if got := inv.GPUs[i].UUID; got != UnnamedUUID(inv.NodeID, i) {
				t.Errorf("gpu %d uuid %q, want %q", i, got, UnnamedUUID(inv.NodeID, i))
			}
		}
		inv.NodeID = "n1"
		if err := inv.Validate(); err != nil {
			t.Errorf("the document: %v", err)
		}
		// GPU 4 has no handle, so no P2P answers: nobody lists it as peer.
		for _, p := range inv.GPUs[0].NVLinkPeers {
			if p == 4 {
				t.Errorf("gpu 0 nvlink peers %v include the lost GPU 4", inv.GPUs[0].NVLinkPeers)
			}
		}
	})
}

func TestNVMLGPUGoesUnhealthy(t *testing.T) {
	tests := []struct {
		name      string
		ignored   []uint64
		xid       uint64
		unhealthy bool
	}{
		{name: "critical XID 79", xid: 79, unhealthy: true},
		{name: "XID 48 double-bit ECC", xid: 48, unhealthy: true},
		{name: "application XID 13 ignored", xid: 13},
		{name: "application XID 109 ignored", xid: 109},
		{name: "configured ignore list", ignored: []uint64{79}, xid: 79},
		{name: "configured list replaces the default", ignored: []uint64{}, xid: 13, unhealthy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMachine(dgxh100.New())
			n := openNVML(t, m, NVMLOptions{IgnoredXIDs: tt.ignored})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.WatchHealth(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("WatchHealth: %v", err)
				}
			}()

			m.events <- nvml.EventData{Device: m.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: tt.xid}
			select {
			case <-n.Changed():
				if !tt.unhealthy {
					t.Fatal("Changed fired for an ignored XID")
				}
			case <-time.After(300 * time.Millisecond):
				if tt.unhealthy {
					t.Fatal("Changed did not fire for a critical XID")
				}
			}
			inv := inventoryOf(t, n)
			for i, g := range inv.GPUs {
				want := !(tt.unhealthy && i == 2)
				if g.Healthy != want {
					t.Errorf("gpu %d healthy = %v, want %v", i, g.Healthy, want)
				}
			}
			if tt.unhealthy && !strings.HasPrefix(inv.GPUs[2].UnhealthyReason, "XID "+itoa(tt.xid)+" (") {
				t.Errorf("reason %q", inv.GPUs[2].UnhealthyReason)
			}
		})
	}
}

func TestNVMLEventWaitFailingMarksAll(t *testing.T) {
	m := newMachine(dgxh100.New())
	create := m.EventSetCreateFunc
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		set, _ := create()
		set.(*mock.EventSet).WaitFunc = func(uint32) (nvml.EventData, nvml.Return) { return nvml.EventData{}, nvml.ERROR_UNKNOWN }
		return set, nvml.SUCCESS
	}
	n := openNVML(t, m, NVMLOptions{})
	if err := n.WatchHealth(context.Background()); err == nil {
		t.Fatal("WatchHealth: no error")
	}
	for i, g := range inventoryOf(t, n).GPUs {
		if g.Healthy {
			t.Errorf("gpu %d healthy after event wait failed", i)
		}
	}
}

func TestNVMLEventsNotSupported(t *testing.T) {
	m := newMachine(dgxh100.New())
	for i := range m.Devices {
		m.device(i).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	n := openNVML(t, m, NVMLOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := n.WatchHealth(ctx); err != nil {
		t.Fatalf("WatchHealth: %v", err)
	}
	for i, g := range inventoryOf(t, n).GPUs {
		if !g.Healthy {
			t.Errorf("gpu %d unhealthy though only its events are unsupported", i)
		}
	}
}

func itoa(x uint64) string { return strconv.FormatUint(x, 10) }

// TestNVMLFabricClique: a GPU whose fabric manager registered it reports
// its NVLink clique (GB200 and later), which becomes the node's NVLink
// domain; one still registering, or without a fabric, reports none, and
// the node label names the domain instead.
func TestNVMLFabricClique(t *testing.T) {
	uuid := [16]uint8{0x6b, 0x1c, 0x2d, 0x3e, 0x4f, 0x50, 0x61, 0x72, 0x83, 0x94, 0xa5, 0xb6, 0xc7, 0xd8, 0xe9, 0xfa}
	cases := []struct {
		name   string
		info   nvml.GpuFabricInfo
		ret    nvml.Return
		want   *Fabric
		labels map[string]string
		domain string
	}{
		{name: "registered", info: nvml.GpuFabricInfo{ClusterUuid: uuid, CliqueId: 7, State: nvml.GPU_FABRIC_STATE_COMPLETED},
			want: &Fabric{ClusterUUID: "6b1c2d3e-4f50-6172-8394-a5b6c7d8e9fa", CliqueID: 7}, domain: "6b1c2d3e-4f50-6172-8394-a5b6c7d8e9fa.7"},
		{name: "still registering", info: nvml.GpuFabricInfo{ClusterUuid: uuid, CliqueId: 7, State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}},
		{name: "no fabric", ret: nvml.ERROR_NOT_SUPPORTED, labels: map[string]string{CliqueLabel: "rack-3"}, domain: "rack-3"},
		{name: "old driver", ret: nvml.ERROR_FUNCTION_NOT_FOUND},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(dgxh100.New())
			for _, d := range m.Devices {
				d.(*server.Device).GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) { return c.info, c.ret }
			}
			inv := inventoryOf(t, openNVML(t, m, NVMLOptions{}))
			inv.Labels = c.labels
			for _, g := range inv.GPUs {
				if fmt.Sprint(g.Fabric) != fmt.Sprint(c.want) || (c.want != nil && *g.Fabric != *c.want) {
					t.Fatalf("gpu %d fabric %+v, want %+v", g.Index, g.Fabric, c.want)
				}
			}
			if d := inv.Domain(); d != c.domain {
				t.Errorf("domain %q, want %q", d, c.domain)
			}
		})
	}
}

// TestNVMLProcesses: a GPU's processes are in its inventory, by pid, a
// pid listed as compute and graphics once, named from /proc where it
// can be read; the watch fires when the set of processes changes, not
// when their memory does.
func TestNVMLProcesses(t *testing.T) {
	m := newMachine(dgxh100.New())
	n, err := OpenNVML(m, NVMLOptions{Facts: Facts{NodeID: "n1"}})
	if err != nil {
		t.Fatal(err)
	}
	self := uint32(os.Getpid())
	m.run(3, []nvml.ProcessInfo{{Pid: self, UsedGpuMemory: 1 << 30}, {Pid: 999999999, UsedGpuMemory: ^uint64(0)}},
		[]nvml.ProcessInfo{{Pid: self, UsedGpuMemory: 2 << 30}})
	inv := inventoryOf(t, n)
	want := []Process{{PID: self, UsedMemoryBytes: 2 << 30, Name: processName("/proc", self)}, {PID: 999999999}}
	if got := inv.GPUs[3].Processes; !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 3 processes %+v, want %+v", got, want)
	}
	if want[0].Name == "" {
		t.Error("this test's own process has no name in /proc")
	}
	for i, g := range inv.GPUs {
		if i != 3 && len(g.Processes) > 0 {
			t.Errorf("GPU %d lists %v", i, g.Processes)
		}
	}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.watchProcesses(ctx, 5*time.Millisecond, n.pids())
	// Memory alone: no news. A process ending: news.
	m.run(3, []nvml.ProcessInfo{{Pid: self, UsedGpuMemory: 3 << 30}, {Pid: 999999999}}, nil)
	m.run(3, []nvml.ProcessInfo{{Pid: self, UsedGpuMemory: 3 << 30}}, nil)
	select {
	case <-n.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("a process ending fired no change")
	}
	if got := inventoryOf(t, n).GPUs[3].Processes; len(got) != 1 || got[0].PID != self {
		t.Errorf("after the change: %+v", got)
	}

	// Too many to list: the first MaxProcesses by pid.
	var many []nvml.ProcessInfo
	for pid := range uint32(MaxProcesses + 10) {
		many = append(many, nvml.ProcessInfo{Pid: 4000000 + pid})
	}
	m.run(0, many, nil)
	if got := inventoryOf(t, n).GPUs[0].Processes; len(got) != MaxProcesses || got[0].PID != 4000000 {
		t.Errorf("%d processes listed, first %v", len(got), got[0])
	}
}

// TestNVMLXIDClasses: an XID is classed by the catalog's resolution:
// the application's leaves the GPU healthy; one a reset resolves marks
// it unhealthy until a check, at least HealthEvery later, finds it
// clean (not while row remapping is pending); one that needs a reboot
// or an operator stays, whatever the checks find.
func TestNVMLXIDClasses(t *testing.T) {
	tests := []struct {
		name    string
		xid     uint64
		pending bool // row remapping pending at the first check
		// sick: unhealthy after the XID; after: still unhealthy after the
		// first check, and the second.
		sick          bool
		after, second bool
	}{
		{name: "application 13", xid: 13},
		{name: "contained ECC 94: a reset resolves it", xid: 94, sick: true},
		{name: "double-bit ECC 48, remapping pending", xid: 48, pending: true, sick: true, after: true},
		{name: "fallen off the bus 79: a reboot", xid: 79, sick: true, after: true, second: true},
		{name: "not in the catalog", xid: 999, sick: true, after: true, second: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMachine(dgxh100.New())
			var mu sync.Mutex
			pending := tt.pending
			for _, d := range m.Devices {
				dev := d.(*server.Device)
				dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
					mu.Lock()
					defer mu.Unlock()
					return 0, 0, pending, false, nvml.SUCCESS
				}
				dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED }
			}
			m.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
				for _, d := range m.Devices {
					if u, _ := d.GetUUID(); u == uuid {
						return d, nvml.SUCCESS
					}
				}
				return nil, nvml.ERROR_NOT_FOUND
			}
			n := openNVML(t, m, NVMLOptions{HealthEvery: time.Minute})
			now := time.Unix(1_000_000, 0)
			var clock sync.Mutex
			n.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.WatchHealth(ctx) }()
			defer func() { cancel(); <-done }()

			m.events <- nvml.EventData{Device: m.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: tt.xid}
			select {
			case <-n.Changed():
			case <-time.After(300 * time.Millisecond):
			}
			sick := func() bool { return !inventoryOf(t, n).GPUs[2].Healthy }
			if got := sick(); got != tt.sick {
				t.Fatalf("after XID %d: unhealthy %v, want %v", tt.xid, got, tt.sick)
			}
			// Too soon: no check clears it.
			n.RecheckHealth()
			if got := sick(); got != tt.sick {
				t.Errorf("checked at once: unhealthy %v, want %v", got, tt.sick)
			}
			clock.Lock()
			now = now.Add(time.Minute)
			clock.Unlock()
			n.RecheckHealth()
			if got := sick(); got != tt.after {
				t.Errorf("first check: unhealthy %v, want %v", got, tt.after)
			}
			mu.Lock()
			pending = false
			mu.Unlock()
			n.RecheckHealth()
			if got := sick(); got != tt.second {
				t.Errorf("second check: unhealthy %v, want %v", got, tt.second)
			}
			for i, g := range inventoryOf(t, n).GPUs {
				if i != 2 && !g.Healthy {
					t.Errorf("GPU %d unhealthy", i)
				}
			}
		})
	}
}

func TestParseXIDInjection(t *testing.T) {
	cases := []struct {
		in    string
		want  XIDInjection
		wrong string
	}{
		{in: "3:94", want: XIDInjection{GPU: 3, Code: 94}},
		{in: "0:79@30s", want: XIDInjection{GPU: 0, Code: 79, After: 30 * time.Second}},
		{in: "8:94", wrong: "GPUs 0 to 7"},
		{in: "3", wrong: "GPU:CODE"},
		{in: "3:x", wrong: "XID"},
		{in: "3:94@soon", wrong: "delay"},
	}
	for _, c := range cases {
		got, err := ParseXIDInjection(c.in, 8)
		if c.wrong != "" {
			if err == nil || !strings.Contains(err.Error(), c.wrong) {
				t.Errorf("%q: err %v, want one saying %q", c.in, err, c.wrong)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v", c.in, got, err)
		}
	}
}
