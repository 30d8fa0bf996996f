package service

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processCPU is the CPU this process (planner, embedded server and the
// test's clients together) has used, user and system: on a machine
// shared with other work it says what a change cost better than the
// time it took.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeakRSS starts the process's peak resident set afresh (Linux:
// clear_refs 5), so that peakRSS says what came after, not the setup's
// peak (a filled bucket's); false where it cannot.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSS is this process's peak resident set since resetPeakRSS (its
// VmHWM), in bytes; 0 where /proc does not say. Our own process's, not
// a child's or a parent's (ru_maxrss of RUSAGE_CHILDREN would be).
func peakRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
