package inventory

import (
	"errors"
	"time"

	"github.com/rs/zerolog"
)

// What the NVML source and its callers share, with or without cgo (a
// build without it has no NVML at all).

// ErrNoNVML means the NVML library is not installed: every laptop and CI
// machine. The reporter then reports the node with no GPUs.
var ErrNoNVML = errors.New("NVML library not found")

// NVMLOptions configure an NVML source.
type NVMLOptions struct {
	// Facts are the node facts the GPUs are added to.
	Facts Facts
	// IgnoredXIDs are XID errors that do not make a GPU unhealthy;
	// nil means the catalog's application errors (DefaultIgnoredXIDs,
	// ClassifyXID). A list replaces those: an application error it
	// leaves out marks the GPU unhealthy until it is clean again.
	IgnoredXIDs []uint64
	// HealthEvery is how often a GPU unhealthy for an XID that a reset
	// resolves is checked again (DefaultHealthEvery when zero).
	HealthEvery time.Duration
	// SysfsRoot is where /sys lives, for the NUMA fallback; tests point it
	// at a fixture.
	SysfsRoot string
	// Log receives warnings about calls that failed but did not fail the
	// report.
	Log zerolog.Logger
}

// DefaultIgnoredXIDs are the XID errors the NVIDIA device plugin does not
// count against a GPU's health: they are caused by the application (13
// graphics engine exception, 31 memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception, 109
// context switch timeout), not by the hardware.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}
