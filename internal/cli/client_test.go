package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// startQuickServe runs `planner serve` in-process on a free port with the
// quick start's spec on 4 simulated nodes (and extra flags), until the
// test ends; it returns the server's URL and serve's log.
func startQuickServe(t *testing.T, extra ...string) (string, *syncWriter) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	serveErr := &syncWriter{}
	args := append([]string{"serve", "--listen", addr, "--data-dir", t.TempDir(),
		"--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100", "--no-local-reporter",
		"--debounce", "50ms", "--log-level", "warn"}, extra...)
	go func() { done <- Main(ctx, args, nil, &bytes.Buffer{}, serveErr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	return "nats://" + addr, serveErr
}

// TestServeAndClients runs `planner serve` in-process with simulated nodes
// and drives every client command against it, as a person would from a
// second terminal.
func TestServeAndClients(t *testing.T) {
	server, serveErr := startQuickServe(t)

	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	// The first plan arrives once the simulated nodes reported.
	var code int
	var errOut string
	out := runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server)
	var w struct {
		NodeID   string `json:"node_id"`
		CUDA     string `json:"cuda_visible_devices"`
		Revision int    `json:"revision"`
	}
	if err := json.Unmarshal([]byte(out), &w); err != nil || !strings.HasPrefix(w.CUDA, "GPU-") || w.Revision != 1 || !strings.HasPrefix(w.NodeID, "sim-h100-") {
		t.Fatalf("lookup train 0: %v %+v\n%s", err, w, out)
	}

	if code, out, _ = run(t, "lookup", "--node", w.NodeID, "--server", server); code != 0 || !strings.Contains(out, `"workers"`) {
		t.Errorf("lookup --node: exit %d\n%s", code, out)
	}
	if code, _, errOut = run(t, "lookup", "eval", "999", "--server", server); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("lookup eval 999: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut = run(t, "lookup", "train", "x", "--server", server); code != 2 {
		t.Errorf("lookup train x: exit %d, stderr %q", code, errOut)
	}
	if code, out, _ = run(t, "validate", "--plan", "default", "--spec", "../../examples/vllm-tp4.yaml", "--server", server); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("validate vllm-tp4: exit %d\n%s", code, out)
	}
	// As a new plan, beside default's 24 GPUs: 8 are left.
	if code, out, _ = run(t, "validate", "--spec", "../../examples/vllm-tp4.yaml", "--server", server); code != 1 || !strings.Contains(out, "available 8") {
		t.Errorf("validate vllm-tp4 as a new plan: exit %d\n%s", code, out)
	}
	if code, _, errOut = run(t, "validate", "--plan", "a.b", "--spec", "../../examples/vllm-tp4.yaml", "--server", server); code != 2 || !strings.Contains(errOut, "--plan") {
		t.Errorf("validate --plan a.b: exit %d, %s", code, errOut)
	}
	big := writeFile(t, "big.yaml", "scheduling: {train: {worker_num: 1000, num_cpus: 0, num_gpus: 1}}\n")
	if code, out, _ = run(t, "validate", "--spec", big, "--server", server); code != 1 || !strings.Contains(out, "Insufficient GPUs") {
		t.Errorf("validate 1000 train: exit %d\n%s", code, out)
	}
	if code, out, errOut := run(t, "validate", "--spec", big, "--server", server, "--output", "yaml"); code != 1 || out != "" || !strings.Contains(errOut, "Insufficient GPUs") {
		t.Errorf("validate -o yaml of 1000 train: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Why not, structured: the reply's explanations, printed for a person.
	huge := writeFile(t, "huge.yaml", "scheduling: {eval: {worker_num: 1, num_cpus: 0, num_gpus: 16}}\n")
	if code, out, _ = run(t, "validate", "--plan", "default", "--spec", huge, "--server", server); code != 1 || !strings.Contains(out, "why\n  eval: 0 of 1 placed\n    excluded: fewer than 16 healthy GPUs on") {
		t.Errorf("validate a 16-GPU worker: exit %d\n%s", code, out)
	}
	if code, out, _ = run(t, "history", "--server", server); code != 0 || !strings.Contains(out, "first plan") {
		t.Errorf("history: exit %d\n%s", code, out)
	}

	// A spec change is a new revision, which watch shows and history keeps.
	if code, _, errOut = run(t, "spec", "set", "--plan", "default", "../../examples/vllm-tp4.yaml", "--server", server); code != 0 {
		t.Fatalf("spec set: exit %d: %s", code, errOut)
	}
	var revs []struct {
		Revision int    `json:"revision"`
		Reason   string `json:"reason"`
	}
	out = runUntil(t, 20*time.Second, func(code int, out string) bool {
		revs = nil
		return code == 0 && json.Unmarshal([]byte(out), &revs) == nil && len(revs) >= 2
	}, "history", "--output", "json", "--server", server)
	if len(revs) != 2 || revs[1].Revision != 2 || !strings.Contains(revs[1].Reason, "spec changed") {
		t.Fatalf("history after spec set: %+v\n%s", revs, out)
	}
	// Earlier revisions answer, rebuilt from the stream.
	if code, out, _ = run(t, "lookup", "--revision", "1", "train", "0", "--server", server); code != 0 || !strings.Contains(out, `"revision": 1`) {
		t.Errorf("lookup --revision 1: exit %d\n%s", code, out)
	}
	if code, _, errOut = run(t, "lookup", "--revision", "9", "train", "0", "--server", server); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("lookup --revision 9: exit %d, stderr %q", code, errOut)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer wcancel()
	var wout bytes.Buffer
	Main(wctx, []string{"watch", "--server", server}, nil, &wout, &bytes.Buffer{})
	if !strings.Contains(wout.String(), "revision 2") || !strings.Contains(wout.String(), "GPU map") {
		t.Errorf("watch showed:\n%s", wout.String())
	}

	// One node's assignments: the node's latest at once; a node that never
	// had workers says it waits; a node id no subject can carry is usage.
	for _, c := range []struct {
		node           string
		code           int
		stdout, stderr string
	}{
		{w.NodeID, 0, ": " + w.NodeID + ", 9 workers\n  train ", ""},
		{"nosuch", 0, "", "node nosuch has had no workers in plan default; waiting for its first assignment"},
		{"a b", 2, "", `--node: invalid node id "a b"`},
	} {
		nctx, ncancel := context.WithTimeout(context.Background(), time.Second)
		var nout, nerr bytes.Buffer
		code := Main(nctx, []string{"watch", "--node", c.node, "--server", server}, nil, &nout, &nerr)
		ncancel()
		if code != c.code || !strings.Contains(nout.String(), c.stdout) || !strings.Contains(nerr.String(), c.stderr) {
			t.Errorf("watch --node %q: exit %d\nstdout %s\nstderr %s", c.node, code, nout.String(), nerr.String())
		}
	}
}
