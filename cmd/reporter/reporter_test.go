package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/poolplanner/poolplanner/internal/cli"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
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
	ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()

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
	store := bus.NewInventoryStore(js)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inv, _, err := store.Get(ctx, "n1")
		if err == nil && len(inv.GPUs) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key never appeared: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

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
