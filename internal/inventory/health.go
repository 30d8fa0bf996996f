//go:build cgo

package inventory

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// healthWaitMs is how long one NVML event wait blocks; it bounds how long
// WatchHealth takes to notice that its context is done.
const healthWaitMs = 1000

// WatchHealth waits for critical XID events on every GPU and marks a GPU
// unhealthy on an XID the catalog does not call the application's
// (ClassifyXID, or the ignore list), which fires Changed so the reporter
// re-reports at once; every healthEvery it checks again the GPUs marked
// for an XID a reset resolves, and clears those NVML reports clean
// (RecheckHealth). It returns when ctx is done, or at once with an error
// if no event set can be created; a GPU that cannot register for XID
// events is logged and left unwatched.
func (n *NVML) WatchHealth(ctx context.Context) error {
	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return &NVMLError{Call: "EventSetCreate", Return: ret}
	}
	defer set.Free()

	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return &NVMLError{Call: "DeviceGetCount", Return: ret}
	}
	watched := 0
	for i := range count {
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue // Inventory reports this GPU unusable already
		}
		supported, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&nvml.EventTypeXidCriticalError == 0 {
			n.log.Warn().Int("gpu_index", i).Str("error", nvml.ErrorString(ret)).
				Msg("GPU cannot report XID events; its health is not watched")
			continue
		}
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			n.log.Warn().Int("gpu_index", i).Str("error", nvml.ErrorString(ret)).
				Msg("registering for XID events failed; GPU health is not watched")
			continue
		}
		watched++
	}
	n.log.Debug().Int("gpus", watched).Msg("watching GPU health")

	checked := n.now()
	for ctx.Err() == nil {
		if n.now().Sub(checked) >= n.healthEvery {
			n.RecheckHealth()
			checked = n.now()
		}
		e, ret := set.Wait(n.waitMs)
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			// The device plugin's rule: if events cannot be read, no GPU's
			// health is known, so none is trusted.
			n.markAll(fmt.Sprintf("nvml event wait: %s", nvml.ErrorString(ret)), false)
			return &NVMLError{Call: "EventSetWait", Return: ret}
		case e.EventType != nvml.EventTypeXidCriticalError:
			continue
		}
		action := xidAction(e.EventData, n.ignored)
		if action == XIDIgnore {
			continue
		}
		recoverable := action == XIDReset
		reason := fmt.Sprintf("XID %d (%s)", e.EventData, resolution(action))
		if e.Device == nil {
			n.markAll(reason, recoverable) // an XID not tied to a GPU hits them all
			continue
		}
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			n.markAll(reason, recoverable)
			continue
		}
		n.mark(uuid, reason, recoverable)
	}
	return nil
}

// RecheckHealth clears the marks of GPUs unhealthy for an XID that a
// reset resolves, made at least healthEvery ago, whose GPU NVML now
// reports clean: it answers, and has no row remapping or page
// retirement pending or failed. Changed fires when one clears.
func (n *NVML) RecheckHealth() {
	n.mu.Lock()
	var due []string
	for uuid, m := range n.unhealthy {
		if m.recoverable && n.now().Sub(m.at) >= n.healthEvery {
			due = append(due, uuid)
		}
	}
	n.mu.Unlock()
	cleared := 0
	for _, uuid := range due {
		if !n.clean(uuid) {
			continue
		}
		n.mu.Lock()
		if m, ok := n.unhealthy[uuid]; ok && m.recoverable {
			delete(n.unhealthy, uuid)
			cleared++
			n.log.Info().Str("gpu", uuid).Str("was", m.reason).Msg("GPU clean again: healthy")
		}
		n.mu.Unlock()
	}
	if cleared > 0 {
		n.signal()
	}
}

// clean reports whether NVML says the GPU with uuid is fit again.
func (n *NVML) clean(uuid string) bool {
	d, ret := n.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return false
	}
	if _, ret := d.GetUUID(); ret != nvml.SUCCESS {
		return false // lost, or not answering
	}
	if _, _, pending, failed, ret := d.GetRemappedRows(); ret == nvml.SUCCESS && (pending || failed) {
		return false
	} else if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return false
	}
	if st, ret := d.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
		return false
	} else if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return false
	}
	return true
}

func (n *NVML) markAll(reason string, recoverable bool) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	for i := range count {
		if d, ret := n.lib.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
				n.mark(uuid, reason, recoverable)
			}
		}
	}
}
