package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
	var code int
	var out, errOut string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, out, errOut = run(t, "lookup", "train", "0", "--server", url, "--creds", launcher); code == 0 {
			break
		}
	}
	if code != 0 || !strings.Contains(out, `"cuda_visible_devices"`) {
		t.Fatalf("lookup as launcher: exit %d: %s (serve: %s)", code, errOut, serveErr.String())
	}
	if code, _, errOut = run(t, "lookup", "train", "0", "--server", url); code == 0 || !strings.Contains(errOut, "requires credentials") {
		t.Errorf("without credentials: exit %d: %s", code, errOut)
	}
	code, _, errOut = run(t, "spec", "set", "../../examples/vllm-tp4.yaml", "--server", url, "--creds", filepath.Join(secrets, "creds", "admin.creds"))
	if code != 0 {
		t.Errorf("spec set as admin: exit %d: %s", code, errOut)
	}
}
