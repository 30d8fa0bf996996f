//go:build cgo

package inventory

import (
	"context"
	"errors"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// OpenLocal is this machine's inventory source: its GPUs through NVML,
// watched for critical XIDs until ctx ends when watch is set, or, without
// NVML (laptops, CI) or when NVML fails to start, the node with no GPUs,
// said in one log line. stop ends the watch and releases NVML. The
// reporter and the planner's in-process reporter both start here.
func OpenLocal(ctx context.Context, opts NVMLOptions, watch bool) (src Source, stop func()) {
	nv, err := OpenNVML(nvml.New(), opts)
	switch {
	case errors.Is(err, ErrNoNVML):
		opts.Log.Info().Msg("NVML library not found: reporting this node with no GPUs")
		return NoGPUs{Facts: opts.Facts}, func() {}
	case err != nil:
		opts.Log.Error().Err(err).Msg("NVML failed to start: reporting this node with no GPUs")
		return NoGPUs{Facts: opts.Facts}, func() {}
	}
	if !watch {
		return nv, func() { _ = nv.Close() }
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	procs := make(chan struct{})
	go func() {
		defer close(done)
		if err := nv.WatchHealth(hctx); err != nil {
			opts.Log.Error().Err(err).Msg("GPU health watch stopped")
		}
	}()
	go func() {
		defer close(procs)
		nv.WatchProcesses(hctx, ProcessPoll)
	}()
	return nv, func() { cancel(); <-done; <-procs; _ = nv.Close() }
}
