package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDrainCommands: under --auth an admin drains a node and a GPU,
// lists them (who, role, reason, deadline), and undrains them; the
// workers leave the drained node; a launcher lists them too, but its
// drain and undrain are refused, as a reporter's listing is; bad
// targets and deadlines are usage errors.
func TestDrainCommands(t *testing.T) {
	addr := freeAddr(t)
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	serveErr := &syncWriter{}
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", dataDir, "--auth", "--debounce", "50ms",
			"--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100", "--no-local-reporter", "--log-level", "warn"}, nil, &bytes.Buffer{}, serveErr)
	}()
	defer func() { cancel(); <-done }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	server := "nats://" + addr
	admin := filepath.Join(dataDir, "creds", "admin.creds")
	launcher := filepath.Join(dataDir, "creds", "launcher.creds")
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server, "--creds", launcher)

	code, out, errOut := run(t, "drain", "sim-h100-1", "sim-h100-2:3", "--reason", "driver upgrade", "--server", server, "--creds", admin)
	if code != 0 || !strings.Contains(out, "drained sim-h100-1: its workers move off now") || !strings.Contains(out, "drained sim-h100-2:3") {
		t.Fatalf("drain: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = run(t, "drain", "sim-h100-3", "--deadline", "1h", "--server", server, "--creds", admin)
	if code != 0 || !strings.Contains(out, "its workers leave at ") {
		t.Fatalf("drain --deadline: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = run(t, "drain", "--list", "--output", "json", "--server", server, "--creds", admin)
	var ls []drainListing
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || len(ls) != 3 {
		t.Fatalf("drain --list: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = run(t, "drain", "elsewhere", "--server", server, "--creds", admin)
	if code != 0 || !strings.Contains(errOut, "node elsewhere is not in the inventory") {
		t.Errorf("drain of a node not reported: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, _, errOut = run(t, "undrain", "elsewhere", "--server", server, "--creds", admin); code != 0 {
		t.Errorf("undrain elsewhere: exit %d, %s", code, errOut)
	}
	for _, l := range ls {
		if l.Role != "admin" || !strings.Contains(l.By, "@") || l.Cause != "operator" || l.At.IsZero() {
			t.Errorf("listed %+v: want who (admin), when, cause operator", l)
		}
	}
	if ls[0].Target != "sim-h100-1" || ls[0].Reason != "driver upgrade" || ls[2].Target != "sim-h100-3" || !ls[2].Leaving || ls[2].Deadline == nil {
		t.Errorf("listed %+v", ls)
	}
	// The workers leave the node drained at once.
	runUntil(t, 20*time.Second, func(code int, out string) bool { return code == 0 && !strings.Contains(out, `"component"`) },
		"lookup", "--node", "sim-h100-1", "--server", server, "--creds", launcher)

	// status says what is drained, and the revision why its workers
	// moved. The history holds that revision: the planner may see the
	// drains in one revision or in more (status shows the latest).
	code, out, errOut = run(t, "status", "--server", server, "--creds", launcher)
	if code != 0 || !strings.Contains(out, "drained (3):") || !strings.Contains(out, "leaving at ") {
		t.Errorf("status: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = run(t, "history", "--server", server, "--creds", launcher)
	if code != 0 || !strings.Contains(out, "drained sim-h100-1 (driver upgrade)") {
		t.Errorf("history: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// A launcher may read the bucket, so it may list it (by direct
	// gets: it may make no consumer there); a reporter may not.
	code, out, errOut = run(t, "drain", "--list", "--server", server, "--creds", launcher)
	if code != 0 || !strings.Contains(out, "sim-h100-2:3") || strings.Count(out, "operator") != 3 {
		t.Errorf("drain --list as a launcher: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	reporter := filepath.Join(t.TempDir(), "reporter.creds")
	if code, _, errOut = run(t, "creds", "reporter", "--node-id", "sim-h100-1", "--data-dir", dataDir, "--output", reporter); code != 0 {
		t.Fatalf("creds reporter: exit %d, %s", code, errOut)
	}
	code, out, errOut = run(t, "drain", "--list", "--server", server, "--creds", reporter)
	if code != 1 || out != "" || !strings.Contains(errOut, "listing the drains needs launcher credentials") {
		t.Errorf("drain --list as a reporter: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	for _, args := range [][]string{{"drain", "sim-h100-4"}, {"undrain", "sim-h100-1"}} {
		code, out, errOut = run(t, append(args, "--server", server, "--creds", launcher)...)
		if code != 1 || out != "" || !strings.Contains(errOut, "needs admin credentials") {
			t.Errorf("%s as a launcher: exit %d\nstdout %s\nstderr %s", args[0], code, out, errOut)
		}
	}

	code, out, errOut = run(t, "undrain", "sim-h100-1", "sim-h100-2:3", "sim-h100-3", "--server", server, "--creds", admin)
	if code != 0 || strings.Count(out, "undrained ") != 3 {
		t.Fatalf("undrain: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, _, errOut = run(t, "undrain", "sim-h100-1", "--server", server, "--creds", admin)
	if code != 1 || !strings.Contains(errOut, "sim-h100-1 is not drained") {
		t.Errorf("undrain of a node not drained: exit %d, stderr %s", code, errOut)
	}
	code, out, _ = run(t, "drain", "--list", "--server", server, "--creds", admin)
	if code != 0 || !strings.Contains(out, "nothing drained") {
		t.Errorf("drain --list after undrain: exit %d, %s", code, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"drain"}, "name at least one"},
		{[]string{"drain", "n1:x"}, "GPU index"},
		{[]string{"drain", "bad node"}, "node id"},
		{[]string{"drain", "n1", "--deadline", "soon"}, "--deadline"},
		{[]string{"drain", "n1", "--deadline", "2000-01-01T00:00:00Z"}, "has passed"},
		{[]string{"drain", "--list", "n1"}, "--list takes no"},
		{[]string{"drain", "sim-h100-1:8"}, "node sim-h100-1 has 8 GPUs (0 to 7)"},
	} {
		code, out, errOut := run(t, append(c.args, "--server", server, "--creds", admin)...)
		if code != ExitUsage || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 saying %q", c.args, code, out, errOut, c.want)
		}
	}
}
