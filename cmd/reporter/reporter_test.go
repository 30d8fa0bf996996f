package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/cli"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.ReporterMain(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestOnceSimulateStableUUIDs(t *testing.T) {
	var runs [2][]string
	for i := range runs {
		code, out, stderr := runMain(t, "--once", "--simulate", "8xH100", "--node-id", "n1", "--label", "zone=a")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var inv inventory.NodeInventory
		if err := json.Unmarshal([]byte(out), &inv); err != nil {
			t.Fatalf("stdout is not a NodeInventory: %v\n%s", err, out)
		}
		if inv.NodeID != "n1" || len(inv.GPUs) != 8 || inv.Labels["zone"] != "a" || inv.ReportedAt.IsZero() {
			t.Fatalf("inventory = %+v", inv)
		}
		seen := map[string]bool{}
		for _, g := range inv.GPUs {
			seen[g.UUID] = true
			runs[i] = append(runs[i], g.UUID)
		}
		if len(seen) != 8 {
			t.Errorf("%d distinct UUIDs, want 8", len(seen))
		}
	}
	if strings.Join(runs[0], ",") != strings.Join(runs[1], ",") {
		t.Errorf("UUIDs differ between runs:\n%v\n%v", runs[0], runs[1])
	}
}

// Without NVML (this machine, CI) --once reports the node with no GPUs
// and says why in one log line.
func TestOnceWithoutNVML(t *testing.T) {
	code, out, stderr := runMain(t, "--once", "--node-id", "n1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "NVML library not found") {
		t.Skipf("this machine has NVML: %s", stderr)
	}
	var inv inventory.NodeInventory
	if err := json.Unmarshal([]byte(out), &inv); err != nil || inv.GPUs == nil || len(inv.GPUs) != 0 {
		t.Errorf("inventory %+v, %v; want gpus: []", inv, err)
	}
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--heartbeat", "soon"}, "--heartbeat"},
		{[]string{"--heartbeat", "-1s"}, "--heartbeat -1s: must be positive"},
		{[]string{"--ttl", "500ms", "--heartbeat", "100ms"}, "--ttl 500ms: must be at least 1s"},
		{[]string{"--ttl", "5s"}, "--ttl 5s: must be longer than --heartbeat 5s"},
		{[]string{"--simulate", "8xV100"}, `--simulate "8xV100": unknown GPU model`},
		{[]string{"--simulate", "lots"}, "--simulate"},
		{[]string{"--label", "zone"}, `--label "zone": want KEY=VALUE`},
		{[]string{"--ip", "10.0.0.300"}, `--ip "10.0.0.300": not an IP address`},
		{[]string{"--node-id", "a b"}, "--node-id: invalid node id"},
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"--xid-ignore", "13,x"}, `--xid-ignore "x"`},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"extra"}, "unknown command"},
	}
	for _, tt := range tests {
		code, out, stderr := runMain(t, append(tt.args, "--once")...)
		if code != 2 || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.want) || !strings.HasPrefix(stderr, "reporter: ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, one line with %q", tt.args, code, out, stderr, tt.want)
		}
	}
}

// The child side of TestSIGTERMDeletesKey: the real main, real signals.
func TestMain(m *testing.M) {
	if os.Getenv("REPORTER_TEST_CHILD") == "1" {
		os.Args = append([]string{"reporter"}, strings.Fields(os.Getenv("REPORTER_TEST_ARGS"))...)
		main()
	}
	os.Exit(m.Run())
}

func TestSIGTERMDeletesKey(t *testing.T) {
	url := natstest.Start(t).URL()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REPORTER_TEST_CHILD=1",
		"REPORTER_TEST_ARGS=--server "+url+" --node-id n1 --simulate 4xA100 --heartbeat 1s --ttl 30s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	nc, err := bus.Connect(url, "test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store := store.NewInventoryStore(js)
	ctx := context.Background()
	waited := false
	defer func() { // also as WaitFor fails the test
		if !waited {
			t.Logf("the reporter's stderr:\n%s", stderr.String())
		}
	}()
	natstest.WaitFor(t, 10*time.Second, "the key of 4 GPUs", func() bool {
		inv, _, err := store.Get(ctx, "n1")
		return err == nil && len(inv.GPUs) == 4
	})
	waited = true

	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("reporter exit: %v\n%s", err, stderr.String())
	}
	// The TTL is 30s: the key must be gone because it was deleted.
	if _, _, err := store.Get(ctx, "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("Get after SIGTERM: %v, want ErrKeyNotFound\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "inventory key deleted") {
		t.Errorf("log lacks the delete:\n%s", stderr.String())
	}
}

// child starts the real reporter main as a process of its own.
func child(t *testing.T, args string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REPORTER_TEST_CHILD=1", "REPORTER_TEST_ARGS="+args)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stderr
}

// syncBuffer is a child's stderr, read while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestOneReporterPerNode, with real processes on this host: a second
// reporter for a node whose reporter runs exits 1, naming the host and
// the running one's pid, and the first keeps its key and keeps
// reporting; once the first is killed (its key still live for 30s), a
// new one takes the key over at once; on SIGTERM that one deletes it.
func TestOneReporterPerNode(t *testing.T) {
	url := natstest.Start(t).URL()
	nc, err := bus.Connect(url, "test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store := store.NewInventoryStore(js)
	ctx := context.Background()
	waitKey := func(what string, ok func(inventory.NodeInventory, uint64) bool) (inventory.NodeInventory, uint64) {
		t.Helper()
		var inv inventory.NodeInventory
		var rev uint64
		natstest.WaitFor(t, 10*time.Second, "the key holding "+what, func() bool {
			var err error
			inv, rev, err = store.Get(ctx, "n1")
			return err == nil && ok(inv, rev)
		})
		return inv, rev
	}
	args := "--server " + url + " --node-id n1 --simulate 4xA100 --heartbeat 200ms --ttl 30s"
	host, _ := os.Hostname()

	first, firstErr := child(t, args)
	owner, _ := waitKey("the first reporter's document", func(inv inventory.NodeInventory, _ uint64) bool {
		return inv.ReporterPID == first.Process.Pid
	})

	second, secondErr := child(t, args)
	err = second.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second reporter: %v, want exit 1\n%s", err, secondErr.String())
	}
	for _, want := range []string{"another reporter writes this node's key", "host " + host, fmt.Sprintf("pid %d", first.Process.Pid), "is running on this host"} {
		if !strings.Contains(secondErr.String(), want) {
			t.Errorf("the second reporter's stderr lacks %q:\n%s", want, secondErr.String())
		}
	}
	_, refused, _ := store.Get(ctx, "n1")
	inv, _ := waitKey("the first reporter's heartbeats", func(_ inventory.NodeInventory, rev uint64) bool { return rev >= refused+3 })
	if inv.Reporter != owner.Reporter || inv.ReporterPID != first.Process.Pid {
		t.Errorf("the key is reporter %s pid %d's, want the first's (%s, %d)", inv.Reporter, inv.ReporterPID, owner.Reporter, first.Process.Pid)
	}
	if !reporter.ProcessAlive(first.Process.Pid) {
		t.Fatalf("the first reporter exited:\n%s", firstErr.String())
	}

	// Killed: no delete; the key would live 30s more.
	_ = first.Process.Kill()
	_ = first.Wait()
	killed := time.Now()
	third, thirdErr := child(t, args)
	waitKey("the new reporter's document", func(inv inventory.NodeInventory, _ uint64) bool {
		return inv.ReporterPID == third.Process.Pid
	})
	if d := time.Since(killed); d > 15*time.Second {
		t.Errorf("took over %s after the kill: the TTL's doing", d)
	}
	if !strings.Contains(thirdErr.String(), "taking over the inventory key from a reporter that no longer runs") {
		t.Errorf("the new reporter's log does not say it took over:\n%s", thirdErr.String())
	}
	_ = third.Process.Signal(syscall.SIGTERM)
	if err := third.Wait(); err != nil {
		t.Fatalf("third reporter: %v\n%s", err, thirdErr.String())
	}
	if _, _, err := store.Get(ctx, "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after SIGTERM: %v, want the key deleted", err)
	}
}
