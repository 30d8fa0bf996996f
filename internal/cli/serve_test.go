package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestServeClusterFlags: the cluster and replica flags that cannot work
// are refused at once, with exit 2 and the flag named.
func TestServeClusterFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas 0: must be 1 to 5"},
		{[]string{"--replicas", "7"}, "--replicas 7: must be 1 to 5"},
		{[]string{"--replicas", "3"}, "--replicas 3: the embedded server needs --cluster-listen and --routes naming at least 2 other servers"},
		{[]string{"--replicas", "3", "--cluster-listen", "127.0.0.1:6222", "--routes", "nats://127.0.0.1:6223"}, "at least 2 other servers"},
		{[]string{"--routes", "nats://127.0.0.1:6223"}, "--routes needs --cluster-listen"},
		{[]string{"--cluster-listen", "6222"}, `--cluster-listen "6222": want HOST:PORT`},
		{[]string{"--cluster-listen", "127.0.0.1:6222", "--routes", "127.0.0.1:6223"}, `--routes "127.0.0.1:6223": want nats://HOST:PORT`},
		{[]string{"--server", "nats://127.0.0.1:4222", "--cluster-listen", "127.0.0.1:6222"}, "not with --server"},
		{[]string{"--cluster-listen", "0.0.0.0:6222"}, "add --auth"},
		{[]string{"--lease-ttl", "100ms"}, "--lease-ttl 100ms: must be 1s to 1h"},
	}
	for _, c := range cases {
		args := append([]string{"serve", "--no-local-reporter"}, c.args...)
		code, _, errOut := run(t, args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("planner %s: exit %d, %q; want exit %d and %q", strings.Join(args, " "), code, errOut, ExitUsage, c.want)
		}
	}
}

// TestServeDataDirAndPort: a second serve on a data directory in use,
// or on a taken port, refuses at once saying which.
func TestServeDataDirAndPort(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", dir, "--no-local-reporter", "--log-level", "error"}, nil, &bytes.Buffer{}, &bytes.Buffer{})
	}()
	defer func() { cancel(); <-done }()
	natstest.WaitFor(t, 10*time.Second, "the first serve up", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	start := time.Now()
	code, _, errOut := run(t, "serve", "--listen", freeAddr(t), "--data-dir", dir, "--no-local-reporter")
	if code == 0 || !strings.Contains(errOut, "--data-dir "+dir+" is held by process") || time.Since(start) > 8*time.Second {
		t.Errorf("second serve on the same data dir: exit %d after %s: %s", code, time.Since(start), errOut)
	}
	start = time.Now()
	code, _, errOut = run(t, "serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter")
	if code == 0 || !strings.Contains(errOut, "listen "+addr) || !strings.Contains(errOut, "address already in use") || time.Since(start) > 8*time.Second {
		t.Errorf("serve on a taken port: exit %d after %s: %s", code, time.Since(start), errOut)
	}
}

// TestServeCleanShutdown: a serve stopped on purpose logs nothing
// alarming: no warning, no error, no NATS banner at info.
func TestServeCleanShutdown(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncWriter
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter",
			"--simulate", "4x8xH100", "--spec", "../../examples/disaggregate.yaml", "--settle", "-1s"}, nil, &bytes.Buffer{}, &stderr)
	}()
	// What serve logs is this test's subject: it waits on its line too.
	natstest.WaitFor(t, 20*time.Second, "a plan published", func() bool { return strings.Contains(stderr.String(), "plan published") })
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) || strings.Contains(line, "nats-server") {
			t.Errorf("alarming line: %s", line)
		}
	}
}

// syncWriter is a buffer written by one goroutine and read by another.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestParseBytes: --memory takes bytes or binary units.
func TestParseBytes(t *testing.T) {
	cases := map[string]uint64{"": 0, "1024": 1024, "2Ti": 2 << 40, "2T": 2 << 40, "512Gi": 512 << 30, "1.5G": 3 << 29, "64Mi": 64 << 20, "4Ki": 4096}
	for in, want := range cases {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"lots", "-1Gi", "0", "Gi", "1Pi"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q): no error", bad)
		}
	}
}

// TestQuickStartWithReporters: the README's example spec plans on four
// `reporter --simulate 8xH100` against `serve --no-local-reporter`: a
// simulated node is a whole node, with a DGX's CPUs, not this machine's.
func TestQuickStartWithReporters(t *testing.T) {
	addr := freeAddr(t)
	url := "nats://" + addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 5)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter",
			"--spec", "../../examples/disaggregate.yaml", "--settle", "-1s", "--log-level", "error"}, nil, &bytes.Buffer{}, &bytes.Buffer{})
	}()
	maddr := freeAddr(t)
	for i := range 4 {
		args := []string{"--server", url, "--simulate", "8xH100", "--node-id", fmt.Sprintf("gpu-%d", i+1),
			"--ip", fmt.Sprintf("10.0.0.%d", i+1), "--log-level", "error"}
		if i == 0 {
			args = append(args, "--metrics-listen", maddr)
		}
		go func() { done <- ReporterMain(ctx, args, &bytes.Buffer{}, &bytes.Buffer{}) }()
	}
	defer func() {
		cancel()
		for range 5 {
			<-done
		}
	}()
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url) // a valid plan on the four reporters
	// The reporter's metrics: its first put, a change.
	if text := scrape(t, "http://"+maddr+"/metrics"); metricValue(text, `poolplanner_reporter_puts_total{kind="change"}`) != 1 {
		t.Errorf("reporter metrics:\n%s", grep(text, "poolplanner_"))
	}
}

// TestServeExitsWhenConnectionClosed: a connection the server will not
// take back (its credentials no longer work) ends serve with an error,
// so a supervisor restarts it, rather than a planner that lingers
// without NATS; closing it on purpose is not that.
func TestServeExitsWhenConnectionClosed(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, Username: "planner", Password: "one"}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(ns.Shutdown)
	addr := ns.Addr().(*net.TCPAddr)
	o := &serveOptions{server: fmt.Sprintf("nats://planner:one@127.0.0.1:%d", addr.Port)}
	ctx, lost := context.WithCancelCause(context.Background())
	defer lost(nil)
	nc, shutdown, err := o.connect(zerolog.Nop(), lost, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	reload := *opts
	reload.Password = "two"
	if err := ns.ReloadOptions(&reload); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not notice its connection closed for good")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, errConnClosed) {
		t.Fatalf("cause %v", cause)
	}
	shutdown()

	// Closed on purpose: no cause.
	ctx2, lost2 := context.WithCancelCause(context.Background())
	defer lost2(nil)
	o.server = fmt.Sprintf("nats://planner:two@127.0.0.1:%d", addr.Port)
	_, shutdown2, err := o.connect(zerolog.Nop(), lost2, nil)
	if err != nil {
		t.Fatal(err)
	}
	shutdown2()
	if context.Cause(ctx2) != nil {
		t.Fatalf("a deliberate close ended serve: %v", context.Cause(ctx2))
	}
}

// TestParseSimNodes: --simulate takes a count, a model and labels for
// those nodes; bad labels are refused naming the flag.
func TestParseSimNodes(t *testing.T) {
	for _, c := range []struct {
		in     string
		nodes  int
		labels map[string]string
		err    string
	}{
		{"8xH100", 1, nil, ""},
		{"2x8xB200:zone=b", 2, map[string]string{"zone": "b"}, ""},
		{"3x4xL40S:zone=a,rack=r7", 3, map[string]string{"zone": "a", "rack": "r7"}, ""},
		{"2x8xH100:zone", 0, nil, "--simulate 2x8xH100:zone: labels"},
		{"2x8xH100:zone=a,zone=b", 0, nil, "given twice"},
		{"0x8xH100", 0, nil, "node count must be 1 to 10000"},
	} {
		sn, err := parseSimNodes(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || sn.Nodes != c.nodes || !maps.Equal(sn.Labels, c.labels) {
			t.Errorf("%s: %+v %v", c.in, sn, err)
		}
	}
}

// TestServeSpecDiffers: serve --spec on a data directory whose plan has
// a different stored spec keeps the stored one and says so on stderr in
// a sentence; status names the spec in force and since when.
func TestServeSpecDiffers(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	url := "nats://" + addr
	serve := func(ctx context.Context, spec string, stderr io.Writer) <-chan int {
		done := make(chan int, 1)
		go func() {
			done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", dir, "--no-local-reporter", "--simulate", "4x8xH100",
				"--spec", spec, "--settle", "-1s", "--log-level", "error"}, nil, &bytes.Buffer{}, stderr)
		}()
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := &syncWriter{}
	done := serve(ctx, "../../examples/disaggregate.yaml", first)
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("first serve: exit %d: %s", code, first.String())
	}
	if strings.Contains(first.String(), "NOT in force") {
		t.Errorf("a first serve said its spec is not in force: %s", first.String())
	}

	ctx, cancel = context.WithCancel(context.Background())
	second := &syncWriter{}
	done = serve(ctx, "../../examples/vllm-tp4.yaml", second)
	defer func() { cancel(); <-done }()
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", url)
	natstest.WaitFor(t, 10*time.Second, "serve saying the file is not in force", func() bool {
		return strings.Contains(second.String(), "plan default keeps its stored spec (spec revision 1, stored ")
	})
	if s := second.String(); !strings.Contains(s, "differs from --spec ../../examples/vllm-tp4.yaml: the file is NOT in force") ||
		!strings.Contains(s, "planner spec set --plan default ../../examples/vllm-tp4.yaml") || !strings.Contains(s, "--replace-spec") {
		t.Errorf("serve's stderr: %s", s)
	}
	code, out, errOut := run(t, "status", "--server", url, "-o", "json")
	var r statusReport
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Spec == nil || r.Spec.Revision != 1 || !r.Spec.InForce || r.Spec.StoredAt.IsZero() {
		t.Fatalf("status -o json: exit %d, spec %+v: %s%s", code, r.Spec, out, errOut)
	}
	if code, out, _ = run(t, "status", "--server", url); code != 0 || !strings.Contains(out, "  spec: spec revision 1, stored ") || !strings.Contains(out, ", in force\n") {
		t.Errorf("status: exit %d:\n%s", code, out)
	}
}
