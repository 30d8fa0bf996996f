//go:build !cgo

package inventory

import "context"

// OpenLocal, in a build without cgo, cannot load NVML (go-nvml needs
// cgo): it reports the node with no GPUs and says so in one log line.
// Build with cgo (a C compiler) on GPU nodes.
func OpenLocal(_ context.Context, opts NVMLOptions, _ bool) (src Source, stop func()) {
	opts.Log.Warn().Msg("built without cgo, so NVML cannot be loaded: reporting this node with no GPUs (build the reporter with CGO_ENABLED=1 on GPU nodes)")
	return NoGPUs{Facts: opts.Facts}, func() {}
}
