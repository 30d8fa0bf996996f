package bus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/client"
)

// ErrDataDirInUse is LockDataDir's answer when another process holds the
// directory: two servers on one JetStream store corrupt it.
var ErrDataDirInUse = errors.New("data directory in use")

// LockDataDir takes dir (made if missing) for this process: an exclusive
// lock on dir/LOCK, held until release or exit (a crashed holder leaves
// no stale lock: the kernel drops it). A second process gets
// ErrDataDirInUse naming the holder's pid.
func LockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	if err := lockFile(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		who := "another process"
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(holder))); perr == nil {
			who = fmt.Sprintf("process %d", pid)
		}
		return nil, fmt.Errorf("%w: --data-dir %s is held by %s (another planner serve?); give each server its own --data-dir", ErrDataDirInUse, dir, who)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { _ = unlockFile(f); _ = f.Close() }, nil
}

// OpenAccount is the account an embedded server without credentials
// keeps its streams under.
const OpenAccount = "$G"

// HistoryElsewhere says which other accounts' directories under dir
// hold a plan stream while account's holds none: a data directory first
// served open and now with --auth (or the other way round), whose
// history the server will not show in this account.
func HistoryElsewhere(dir, account string) []string {
	has := func(acc string) bool {
		_, err := os.Stat(filepath.Join(dir, "jetstream", acc, "streams", client.PlansStream))
		return err == nil
	}
	if has(account) {
		return nil
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "jetstream"))
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != account && has(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}
