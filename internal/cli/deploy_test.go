package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// TestDeployNATSConfig: deploy/nats.conf, with the files `planner auth
// init` writes beside it, runs a stock server that requires poolplanner's
// credentials; a planner and a launcher with theirs work against it, a
// client without is refused.
func TestDeployNATSConfig(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	conf, err := os.ReadFile("../../deploy/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(conf), "listen: 0.0.0.0:4222", "listen: "+addr, 1)
	text = strings.Replace(text, "store_dir: /data", "store_dir: "+filepath.Join(dir, "data"), 1)
	if text == string(conf) {
		t.Fatal("deploy/nats.conf changed shape; update this test")
	}
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := filepath.Join(dir, "secrets")
	if code, _, errOut := run(t, "auth", "init", "--data-dir", secrets, "--reporter", "n1"); code != 0 {
		t.Fatal(errOut)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("deploy/nats.conf with the secrets: %v", err)
	}
	opts.NoSigs = true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	url := "nats://" + addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var serveErr bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"serve", "--server", url, "--creds", filepath.Join(secrets, "creds", "planner.creds"),
			"--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100", "--no-local-reporter", "--log-level", "warn"}, nil, &bytes.Buffer{}, &serveErr)
	}()
	defer func() { cancel(); <-done }()
	launcher := filepath.Join(secrets, "creds", "launcher.creds")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	if out := runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url, "--creds", launcher); !strings.Contains(out, `"cuda_visible_devices"`) {
		t.Fatalf("lookup as launcher: %s", out)
	}
	var code int
	var errOut string
	if code, _, errOut = run(t, "lookup", "train", "0", "--server", url); code == 0 || !strings.Contains(errOut, "requires credentials") {
		t.Errorf("without credentials: exit %d: %s", code, errOut)
	}
	code, _, errOut = run(t, "spec", "set", "../../examples/vllm-tp4.yaml", "--server", url, "--creds", filepath.Join(secrets, "creds", "admin.creds"))
	if code != 0 {
		t.Errorf("spec set as admin: exit %d: %s", code, errOut)
	}
}

// TestDeployNATSCluster: deploy/nats-cluster.conf runs three stock
// servers as one cluster (as docker-compose.ha.yaml does); two planners
// with --replicas 3 on them, one leading, keep answering when a server
// goes without warning, and planner status says who leads.
func TestDeployNATSCluster(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	if code, _, errOut := run(t, "auth", "init", "--data-dir", secrets); code != 0 {
		t.Fatal(errOut)
	}
	conf, err := os.ReadFile("../../deploy/nats-cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	clients, routes := make([]string, 3), make([]string, 3)
	for i := range 3 {
		clients[i], routes[i] = freeAddr(t), freeAddr(t)
	}
	servers := make([]*server.Server, 3)
	var urls []string
	for i := range 3 {
		text := strings.Replace(string(conf), "listen: 0.0.0.0:4222", "listen: "+clients[i], 1)
		text = strings.Replace(text, "listen: 0.0.0.0:6222", "listen: "+routes[i], 1)
		text = strings.Replace(text, "store_dir: /data", "store_dir: "+filepath.Join(dir, fmt.Sprint(i)), 1)
		for j := range 3 {
			text = strings.Replace(text, fmt.Sprintf("nats-route://nats-%d:6222", j+1), "nats-route://"+routes[j], 1)
		}
		if strings.Contains(text, "nats-1") || strings.Contains(text, "0.0.0.0") {
			t.Fatal("deploy/nats-cluster.conf changed shape; update this test")
		}
		file := filepath.Join(dir, fmt.Sprintf("nats-%d.conf", i))
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("SERVER_NAME", fmt.Sprintf("nats-%d", i+1))
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatalf("deploy/nats-cluster.conf: %v", err)
		}
		if opts.ServerName != fmt.Sprintf("nats-%d", i+1) {
			t.Fatalf("server_name %q: SERVER_NAME not taken from the environment", opts.ServerName)
		}
		opts.NoSigs = true
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		servers[i] = ns
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		urls = append(urls, "nats://"+clients[i])
	}
	url := strings.Join(urls, ",")
	planner := filepath.Join(secrets, "creds", "planner.creds")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 2)
	for _, sim := range []string{"4x8xH100", ""} {
		args := []string{"serve", "--server", url, "--creds", planner, "--replicas", "3", "--lease-ttl", "2s",
			"--spec", "../../examples/disaggregate.yaml", "--no-local-reporter", "--log-level", "error"}
		if sim != "" {
			args = append(args, "--simulate", sim)
		}
		go func() { done <- Main(ctx, args, nil, &bytes.Buffer{}, &bytes.Buffer{}) }()
	}
	defer func() { cancel(); <-done; <-done }()
	admin := filepath.Join(secrets, "creds", "admin.creds")
	waitFor := func(what string, args ...string) string {
		t.Helper()
		return runUntil(t, 60*time.Second, func(code int, out string) bool { return code == 0 && strings.Contains(out, what) }, args...)
	}
	waitFor(`"cuda_visible_devices"`, "lookup", "train", "0", "--server", url, "--creds", admin)
	status := waitFor("leader: planner", "status", "--server", url, "--creds", admin)
	if !strings.Contains(status, "POOLPLANNER_PLANS         3") {
		t.Errorf("status does not show the plan stream with three replicas:\n%s", status)
	}
	code, out, _ := run(t, "status", "--server", url, "--creds", admin, "-o", "json")
	var st statusReport
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Leader == nil || st.Leader.Holder == "" || st.Revision < 1 || len(st.Streams) != len(bus.StateStreams()) {
		t.Errorf("status -o json: exit %d, %v: %s", code, err, out)
	}
	if code, _, errOut := run(t, "status", "--server", url, "-o", "yaml"); code != ExitUsage || !strings.Contains(errOut, "--output") {
		t.Errorf("status -o yaml: exit %d: %s", code, errOut)
	}
	servers[1].Shutdown()
	waitFor(`"cuda_visible_devices"`, "lookup", "train", "1", "--server", url, "--creds", admin)
}
