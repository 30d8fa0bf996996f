//go:build cgo

package inventory

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProcessPoll is how often a reporter looks for processes starting or
// ending on its GPUs: NVML has no event for either.
const ProcessPoll = 2 * time.Second

// processes lists what runs on d: NVML's compute and graphics processes,
// one entry per pid (most memory of its entries), by pid, at most
// MaxProcesses, each named from /proc where readable. A GPU that cannot
// say (not supported, or lost) lists none.
func (n *NVML) processes(d nvml.Device) []Process {
	byPID := map[uint32]Process{}
	for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){d.GetComputeRunningProcesses, d.GetGraphicsRunningProcesses} {
		infos, ret := list()
		if ret != nvml.SUCCESS {
			continue // NOT_SUPPORTED on some GPUs; a lost GPU is said elsewhere
		}
		for _, pi := range infos {
			p := byPID[pi.Pid]
			p.PID = pi.Pid
			// NVML says "not available" with all ones.
			if pi.UsedGpuMemory != ^uint64(0) {
				p.UsedMemoryBytes = max(p.UsedMemoryBytes, pi.UsedGpuMemory)
			}
			byPID[pi.Pid] = p
		}
	}
	if len(byPID) == 0 {
		return nil
	}
	out := make([]Process, 0, len(byPID))
	for _, p := range byPID {
		p.Name = processName(n.proc, p.PID)
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Process) int { return int(a.PID) - int(b.PID) })
	if len(out) > MaxProcesses {
		out = out[:MaxProcesses]
	}
	return out
}

// processName is pid's command name from procRoot/PID/comm, "" when it
// cannot be read (another PID namespace: a container sees its own).
func processName(procRoot string, pid uint32) string {
	b, err := os.ReadFile(procRoot + "/" + strconv.FormatUint(uint64(pid), 10) + "/comm")
	if err != nil {
		return ""
	}
	name := strings.TrimSpace(string(b))
	if len(name) > 255 {
		name = name[:255]
	}
	return name
}

// WatchProcesses fires Changed whenever the set of processes on any GPU
// changes (not their memory), looking every interval until ctx ends:
// the reporter then reads and reports the inventory at once.
func (n *NVML) WatchProcesses(ctx context.Context, every time.Duration) {
	n.watchProcesses(ctx, every, n.pids())
}

// watchProcesses is WatchProcesses from the processes last.
func (n *NVML) watchProcesses(ctx context.Context, every time.Duration, last []string) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := n.pids(); !slices.Equal(now, last) {
			last = now
			n.signal()
		}
	}
}

// pids is every GPU's process ids, "index:pid" sorted.
func (n *NVML) pids() []string {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []string
	for i := range count {
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, p := range n.processes(d) {
			out = append(out, strconv.Itoa(i)+":"+strconv.FormatUint(uint64(p.PID), 10))
		}
	}
	slices.Sort(out)
	return out
}
