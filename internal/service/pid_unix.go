//go:build unix

package service

import (
	"errors"
	"syscall"
)

// pidAlive says whether a process of this host has pid (one of another
// user counts: it runs).
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
