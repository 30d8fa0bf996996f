package service

import (
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
