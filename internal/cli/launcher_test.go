package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// workerScript is the CMD the launcher runs: it notes its pid and
// sleeps until told to stop.
const workerScript = `import os, signal, sys
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
`

// liveWorkers is every live worker process the launcher started under
// dir, as component/index -> CUDA_VISIBLE_DEVICES, read from the
// processes themselves (/proc/PID/environ).
func liveWorkers(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	out := map[string]string{}
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		env := map[string]string{}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if k, v, ok := strings.Cut(string(kv), "="); ok {
				env[k] = v
			}
		}
		out[env["POOLPLANNER_COMPONENT"]+"/"+env["POOLPLANNER_INDEX"]] = env["CUDA_VISIBLE_DEVICES"]
	}
	return out
}

// TestLauncherPy: examples/launcher.py runs exactly the plan's workers on
// its node, each with its GPUs' UUIDs; after another spec is stored the
// workers taken off are stopped and the new ones run; SIGTERM stops
// them all. Checked on the processes, not on what it prints.
func TestLauncherPy(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	_ = os.Mkdir(pids, 0o755)
	worker := filepath.Join(dir, "worker.py")
	if err := os.WriteFile(worker, []byte(workerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first := spec("first.yaml", "scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\n  eval: {worker_num: 2, num_cpus: 1, num_gpus: 2}\n  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}\n  env:\n    - {worker_num: 8, num_cpus: 1, num_gpus: 0.25}\nplacement: {mode: auto, strategy: disaggregate, env_strategy: default}\n")
	second := spec("second.yaml", "scheduling:\n  train: {worker_num: 2, num_cpus: 1, num_gpus: 2}\n  eval: {worker_num: 4, num_cpus: 1, num_gpus: 1}\nplacement: {mode: auto, strategy: colocate, env_strategy: default}\n")

	url, serveErr := serveInProcess(t, "--spec", first, "--simulate", "2x8xH100", "--no-local-reporter", "--debounce", "50ms")
	nc := dialRetry(t, url)
	c, _ := client.New(nc)
	const node = "sim-h100-1"
	// want is the node's workers in the plan's revision rev (0: any).
	want := func(rev int) map[string]string {
		out := map[string]string{}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a, err := c.LookupNode(rctx, "default", node)
		if err != nil || a.Revision < rev {
			return nil
		}
		for _, w := range a.Workers {
			out[fmt.Sprintf("%s/%d", w.Component, w.Index)] = w.CUDAVisibleDevices
		}
		return out
	}
	waitRuns := func(rev int) map[string]string {
		t.Helper()
		var w, got map[string]string
		waited := false
		defer func() { // also as WaitEvery fails the test
			if !waited {
				t.Logf("revision %d: the launcher runs\n%v\nthe plan places\n%v\n%s", rev, got, w, serveErr)
			}
		}()
		// Every 100 ms: processes come and go, read from /proc.
		natstest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, fmt.Sprintf("the launcher running revision %d's workers", rev), func() bool {
			w, got = want(rev), liveWorkers(t, pids)
			return len(w) > 0 && fmt.Sprint(w) == fmt.Sprint(got)
		})
		waited = true
		return w
	}

	launcher := exec.Command("python3", "../../examples/launcher.py", "--server", url, "--node-id", node, "--plan", "default",
		"--planner", self, "--grace", "2", "--", "python3", worker, pids)
	launcher.Env = append(os.Environ(), execEnv+"=1")
	var launcherErr syncWriter
	launcher.Stderr = &launcherErr
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if launcher.ProcessState == nil {
			_ = launcher.Process.Kill()
			_ = launcher.Wait()
		}
	}()
	before := waitRuns(1)
	for k, dev := range before {
		if !strings.HasPrefix(dev, "GPU-") && !strings.HasPrefix(k, "buffer/") && !strings.HasPrefix(k, "env/") {
			t.Errorf("%s runs with CUDA_VISIBLE_DEVICES=%q, not GPU UUIDs", k, dev)
		}
	}

	// A worker that dies is started again (with backoff, a second the
	// first time).
	victim := anyLivePid(t, pids)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() { // also as WaitEvery fails the test
		if !restarted {
			t.Logf("the killed worker (pid %d) not started again: %v\n%s", victim, liveWorkers(t, pids), launcherErr.String())
		}
	}()
	natstest.WaitEvery(t, 30*time.Second, 100*time.Millisecond, "the killed worker started again", func() bool {
		_, err := os.Stat(filepath.Join("/proc", fmt.Sprint(victim)))
		return err != nil && fmt.Sprint(liveWorkers(t, pids)) == fmt.Sprint(before)
	})
	restarted = true

	if code, _, errOut := run(t, "spec", "set", "--server", url, second); code != 0 {
		t.Fatalf("spec set: %s", errOut)
	}
	after := waitRuns(2)
	if slices.Equal(sortedKeys(before), sortedKeys(after)) {
		t.Errorf("the second spec changed nothing on %s: %v", node, after)
	}

	if err := launcher.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := launcher.Wait(); err != nil {
		t.Fatalf("launcher on SIGTERM: %v\n%s", err, launcherErr.String())
	}
	if left := liveWorkers(t, pids); len(left) > 0 {
		t.Errorf("workers left running after the launcher stopped: %v", left)
	}
}

// anyLivePid is the pid of one live worker under dir.
func anyLivePid(t *testing.T, dir string) int {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil && syscall.Kill(pid, 0) == nil {
			return pid
		}
	}
	t.Fatal("no live worker")
	return 0
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
