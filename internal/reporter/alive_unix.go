//go:build unix

package reporter

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ProcessAlive tells whether process pid runs on this host: signal 0
// reaches it (or reaches it but may not: EPERM, another user's), and it
// is not a zombie waiting for its parent (Linux's /proc says so). A pid
// reused by another program counts as running: a reporter then waits for
// the key to expire rather than take it over.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc (macOS, BSD): signal 0 decides
	}
	// pid (comm) S ...: the state follows the last ')', as comm may hold
	// one.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}
