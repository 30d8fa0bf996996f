package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
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
	looked := runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url)
	where := strings.Split(strings.Split(looked, `"node_id": "`)[1], `"`)[0]

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

// TestExecWaitsForFreeGPU: a worker whose GPU still runs a process waits
// (saying for what) and starts once the node's reporter reports the GPU
// free; with a short --wait-free it gives up, naming the flag; with
// --wait-free 0 it does not look.
func TestExecWaitsForFreeGPU(t *testing.T) {
	specFile := writeFile(t, "spec.yaml", "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\n")
	url, _ := serveInProcess(t, "--no-local-reporter", "--spec", specFile, "--settle", "-1s")
	// The node's reporter, whose GPUs' processes the test sets.
	src := simulatedNode(t, url, "gpu-1", []int{0})
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url)

	started := make(chan []string, 1)
	fake := func(argv0 string, a, e []string) error { started <- a; return nil }
	execAs := func(errOut io.Writer, args ...string) error {
		root := newRootWith(nil, &bytes.Buffer{}, errOut, fake)
		root.SetArgs(args)
		return root.ExecuteContext(context.Background())
	}
	// Train 0 holds GPU 0 (one GPU a worker, in order): busy.
	if err := execAs(&bytes.Buffer{}, "exec", "train", "0", "--server", url, "--node-id", "gpu-1", "--wait-free", "300ms", "--", "true"); err == nil ||
		!strings.Contains(err.Error(), "GPUs not free after --wait-free 300ms") {
		t.Fatalf("a busy GPU with a short wait: %v", err)
	}
	if err := execAs(&bytes.Buffer{}, "exec", "train", "0", "--server", url, "--node-id", "gpu-1", "--wait-free", "0", "--", "true"); err != nil {
		t.Fatalf("--wait-free 0: %v", err)
	}
	<-started

	var errOut syncWriter
	result := make(chan error, 1)
	go func() {
		result <- execAs(&errOut, "exec", "train", "0", "--server", url, "--node-id", "gpu-1", "--wait-free", "1m", "--", "true")
	}()
	natstest.WaitFor(t, 30*time.Second, "exec saying what it waits for", func() bool {
		return strings.Contains(errOut.String(), "runs pid 0 (simulated)")
	})
	select {
	case err := <-result:
		t.Fatalf("exec went ahead on a busy GPU: %v", err)
	case <-started:
		t.Fatal("exec ran the command on a busy GPU")
	default:
	}
	if err := src.SetBusy(nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("exec after the GPU was freed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("exec did not start once the GPU was free")
	}
	<-started
	if !strings.Contains(errOut.String(), "GPU 0 (GPU-") || strings.Count(errOut.String(), "waits up to") != 1 {
		t.Errorf("what exec said: %q", errOut.String())
	}
}

// TestStatusUnplannedUse: a GPU that runs a process no worker is placed
// on is listed by planner status (text and json).
func TestStatusUnplannedUse(t *testing.T) {
	specFile := writeFile(t, "spec.yaml", "scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\n")
	url, _ := serveInProcess(t, "--no-local-reporter", "--spec", specFile, "--settle", "-1s")
	// Train takes GPUs 0-3; GPU 0 runs its worker, GPU 7 something else.
	simulatedNode(t, url, "gpu-1", []int{0, 7})
	out := runUntil(t, 30*time.Second, func(code int, out string) bool {
		return code == 0 && strings.Contains(out, "UNPLANNED USE") && strings.Contains(out, "plan default: revision 1,")
	}, "status", "--server", url)
	if !strings.Contains(out, "gpu-1 GPU 7 (") || strings.Contains(out, "gpu-1 GPU 0 (") || !strings.Contains(out, "pid 0 (simulated)") {
		t.Errorf("status:\n%s", out)
	}
	code, js2, _ := run(t, "status", "--server", url, "-o", "json")
	var doc struct {
		Unplanned []inventory.UnplannedGPU `json:"unplanned_use"`
	}
	if err := json.Unmarshal([]byte(js2), &doc); code != 0 || err != nil || len(doc.Unplanned) != 1 || doc.Unplanned[0].NodeID != "gpu-1" || doc.Unplanned[0].Index != 7 {
		t.Errorf("status -o json: %v %+v\n%s", err, doc.Unplanned, js2)
	}
}

// TestExecSharedGPUNoWait: workers that share a GPU by design (four env
// workers at a quarter each) do not wait for each other's processes.
func TestExecSharedGPUNoWait(t *testing.T) {
	specFile := writeFile(t, "spec.yaml", "scheduling:\n  env:\n    - {worker_num: 4, num_cpus: 1, num_gpus: 0.25}\n")
	url, _ := serveInProcess(t, "--no-local-reporter", "--spec", specFile, "--settle", "-1s")
	// All four sit on GPU 0, which runs a process (one of them).
	simulatedNode(t, url, "gpu-1", []int{0})
	runUntil(t, 30*time.Second, succeeds, "lookup", "env", "0", "--server", url)
	root := newRootWith(nil, &bytes.Buffer{}, &bytes.Buffer{}, func(string, []string, []string) error { return nil })
	root.SetArgs([]string{"exec", "env", "1", "--server", url, "--node-id", "gpu-1", "--wait-free", "300ms", "--", "true"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("env 1 waited for its siblings' GPU: %v", err)
	}
}
