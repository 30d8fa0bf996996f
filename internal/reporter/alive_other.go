//go:build !unix

package reporter

import "os"

// ProcessAlive tells whether process pid runs on this host, as far as
// the platform lets it be found; a pid it cannot look up counts as
// running (the key's TTL decides then).
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	_ = p.Release()
	return true
}
