package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestExec: planner exec runs the command as the worker, with its GPUs
// and the POOLPLANNER_* variables, only on the worker's node; through a
// real exec the command's output and exit code are the process's.
func TestExec(t *testing.T) {
	addr := freeAddr(t)
	url := "nats://" + addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter",
			"--simulate", "4x8xH100", "--spec", "../../examples/disaggregate.yaml", "--settle", "-1s", "--log-level", "error"}, nil, &bytes.Buffer{}, &bytes.Buffer{})
	}()
	defer func() { cancel(); <-done }()
	var where string
	for deadline := time.Now().Add(30 * time.Second); where == ""; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no plan")
		}
		if code, out, _ := run(t, "lookup", "train", "0", "--server", url); code == 0 {
			where = strings.Split(strings.Split(out, `"node_id": "`)[1], `"`)[0]
		}
	}

	var argv, env []string
	fake := func(argv0 string, a, e []string) error { argv, env = a, e; return nil }
	execAs := func(args ...string) (int, string) {
		var errOut bytes.Buffer
		root := newRootWith(nil, &bytes.Buffer{}, &errOut, fake)
		root.SetArgs(args)
		if err := root.ExecuteContext(context.Background()); err != nil {
			return 1, err.Error()
		}
		return 0, ""
	}
	if code, msg := execAs("exec", "train", "0", "--server", url, "--node-id", where, "--", "sh", "-c", "true"); code != 0 {
		t.Fatalf("exec on the worker's node: %s", msg)
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	if strings.Join(argv, " ") != "sh -c true" || !strings.HasPrefix(vars["CUDA_VISIBLE_DEVICES"], "GPU-") || vars["POOLPLANNER_COMPONENT"] != "train" ||
		vars["POOLPLANNER_INDEX"] != "0" || vars["POOLPLANNER_NODE_ID"] != where || vars["POOLPLANNER_PLAN"] != "default" ||
		vars["POOLPLANNER_REVISION"] != "1" || vars["POOLPLANNER_GPU_SHARE"] != "1" || vars["PATH"] == "" {
		t.Errorf("argv %v, env %v", argv, vars)
	}
	if code, msg := execAs("exec", "train", "0", "--server", url, "--node-id", "elsewhere", "--", "true"); code == 0 || !strings.Contains(msg, "runs on node "+where+", not on this one (elsewhere)") {
		t.Errorf("exec on another node: %d %s", code, msg)
	}
	if code, _, errOut := run(t, "exec", "train", "0", "--server", url, "--", "no-such-command-here"); code != ExitUsage || !strings.Contains(errOut, "no-such-command-here") {
		t.Errorf("exec of a missing command: %d %s", code, errOut)
	}
	if code, _, errOut := run(t, "exec", "train", "0", "sh"); code != ExitUsage || !strings.Contains(errOut, "COMPONENT INDEX -- CMD") {
		t.Errorf("exec without --: %d %s", code, errOut)
	}

	// For real: this test binary is the planner (TestMain), replaced by sh.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "exec", "train", "0", "--server", url, "--node-id", where, "--", "sh", "-c", `echo "$POOLPLANNER_COMPONENT $POOLPLANNER_INDEX $CUDA_VISIBLE_DEVICES"; exit 7`)
	cmd.Env = append(os.Environ(), execEnv+"=1")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.HasPrefix(string(out), "train 0 GPU-") {
		t.Errorf("real exec: %v, output %q", err, out)
	}
}
