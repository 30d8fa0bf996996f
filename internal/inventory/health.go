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
// unhealthy on any XID not in the ignore list, which fires Changed so the
// reporter re-reports at once. It returns when ctx is done, or at once
// with an error if no event set can be created; a GPU that cannot register
// for XID events is logged and left unwatched.
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

	for ctx.Err() == nil {
		e, ret := set.Wait(n.waitMs)
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			// The device plugin's rule: if events cannot be read, no GPU's
			// health is known, so none is trusted.
			n.markAll(fmt.Sprintf("nvml event wait: %s", nvml.ErrorString(ret)))
			return &NVMLError{Call: "EventSetWait", Return: ret}
		case e.EventType != nvml.EventTypeXidCriticalError, n.ignored[e.EventData]:
			continue
		}
		reason := fmt.Sprintf("XID %d", e.EventData)
		if e.Device == nil {
			n.markAll(reason) // an XID not tied to a GPU hits them all
			continue
		}
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			n.markAll(reason)
			continue
		}
		n.MarkUnhealthy(uuid, reason)
	}
	return nil
}

func (n *NVML) markAll(reason string) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	for i := range count {
		if d, ret := n.lib.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
				n.MarkUnhealthy(uuid, reason)
			}
		}
	}
}
