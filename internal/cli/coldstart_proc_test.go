package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// execNATSEnv, set in a test binary's environment to "HOST:PORT DIR",
// makes it a bare NATS server with JetStream storing in DIR until
// SIGTERM: the process benchmark's server, apart from the planner it
// measures, as `planner serve --server` runs beside a stock nats-server.
const execNATSEnv = "POOLPLANNER_TEST_EXEC_NATS"

// execHeapProfileEnv, set to a file's path in a planner child's
// environment (execEnv), has it write its heap's profile, after a
// collection, each time the live heap passes its largest so far by a
// quarter (few enough that the collections forced do not change much),
// as FILE.PID.1, FILE.PID.2, ...: the last says what is live at the
// process's worst moment (go tool pprof -sample_index=inuse_space), two
// diffed (-diff_base) what it allocated in between; FILE.PID.end, written
// once serve has stopped, what it allocated in all (-sample_index=alloc_space).
const execHeapProfileEnv = "POOLPLANNER_TEST_HEAP_PROFILE"

// plannerGODEBUGEnv is the GODEBUG of the benchmark's planner processes
// alone (gctrace=1: the collections that make their peak), not of the
// benchmark's or its NATS server's.
const plannerGODEBUGEnv = "POOLPLANNER_TEST_PLANNER_GODEBUG"

// profileHeapPeaks writes path's profile at each new peak of the live
// heap, until ctx is done.
func profileHeapPeaks(ctx context.Context, path string) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var most uint64
	k := 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		metrics.Read(sample)
		live := sample[0].Value.Uint64()
		if live <= most+most/4 {
			continue
		}
		most = live
		// A profile says what the last collection but one found live: a
		// collection now makes it this moment's.
		runtime.GC()
		k++
		writeHeapProfile(fmt.Sprintf("%s.%d.%d", path, os.Getpid(), k))
	}
}

// writeHeapProfile writes the heap's profile to path.
func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	_ = pprof.Lookup("heap").WriteTo(f, 0)
	_ = f.Close()
}

// runNATS is the test binary as execNATSEnv's server; it returns the
// process's exit code.
func runNATS(spec string) int {
	listen, dir, ok := strings.Cut(spec, " ")
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: want HOST:PORT DIR\n", execNATSEnv, spec)
		return 2
	}
	ns, _, err := bus.StartEmbedded(bus.EmbeddedOptions{Listen: listen, StoreDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
	ns.Shutdown()
	ns.WaitForShutdown()
	return 0
}

// BenchmarkColdStartProcess is the planner's own peak memory at n nodes
// as `planner serve --server` runs: the NATS server and the planner
// each their own process (this test binary re-executed), the inventory
// bucket filled from this one before the planner starts, and the
// planner's VmHWM read from /proc once its revision's every assignment
// is acknowledged (poolplanner_inventory_change_to_publish_seconds
// counted it). start=first starts it on the filled bucket, no plan yet;
// start=restart starts a second planner once the first published
// revision 1 and stopped, with one node changed, so that it reads the
// plan back and replans: the worst case. Each round is a new server.
//
// Run: go test -run '^$' -bench 'ColdStartProcess/nodes=20000' -benchtime 1x -timeout 20m ./internal/cli/
func BenchmarkColdStartProcess(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skipf("no /proc to read a process's peak memory from: %v", err)
	}
	for _, n := range []int{1000, 20000} {
		for _, restart := range []bool{false, true} {
			name := fmt.Sprintf("nodes=%d/start=first", n)
			if restart {
				name = fmt.Sprintf("nodes=%d/start=restart", n)
			}
			b.Run(name, func(b *testing.B) { benchColdStartProcess(b, n, restart) })
		}
	}
}

func benchColdStartProcess(b *testing.B, n int, restart bool) {
	dir := b.TempDir()
	spec := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(spec, []byte(procScaleSpec(n)), 0o644); err != nil {
		b.Fatal(err)
	}
	docs := procNodeDocs(b, n)
	var peak, rss uint64
	var took time.Duration
	k := 0
	for b.Loop() {
		b.StopTimer()
		srv := startNATSProc(b, filepath.Join(dir, fmt.Sprintf("js%d", k)))
		nc, err := nats.Connect(srv.url)
		if err != nil {
			b.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		fillProcBucket(b, js, docs)
		if restart {
			first := startPlannerProc(b, srv.url, spec)
			first.waitPublished(b)
			first.stop(b)
			// One node changed (a GPU sick), so that the restart replans
			// and publishes revision 2, not only adopts revision 1.
			if _, err := store.NewInventoryStore(js).Put(context.Background(), procNode(0), procNodeDoc(b, 0, 3), false, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		p := startPlannerProc(b, srv.url, spec)
		p.waitPublished(b)
		took += time.Since(t0)
		b.StopTimer()
		hwm, now := p.memory(b)
		peak, rss = max(peak, hwm), max(rss, now)
		p.stop(b)
		nc.Close()
		srv.stop(b)
		k++
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(k), "ms-to-last-assignment/op")
	b.ReportMetric(float64(peak>>20), "MiB-planner-peak-rss")
	b.ReportMetric(float64(rss>>20), "MiB-planner-rss")
}

// proc is a child process of the benchmark.
type proc struct {
	cmd     *exec.Cmd
	url     string
	metrics string
	// exited is closed once the process has exited and been waited for
	// (err its exit), by the one goroutine that waits for it.
	exited chan struct{}
	err    error
}

// startProc starts cmd, killed and waited for when the benchmark ends
// however it ends (a failed benchmark leaves no child running).
func startProc(b *testing.B, cmd *exec.Cmd) *proc {
	b.Helper()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *proc) stop(b *testing.B) {
	b.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			b.Fatalf("%s: %v", p.cmd.Args, p.err)
		}
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		b.Fatalf("%s: not stopped a minute after SIGTERM", p.cmd.Args)
	}
}

func startNATSProc(b *testing.B, dir string) *proc {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	listen := freeAddr(b)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), execNATSEnv+"="+listen+" "+dir)
	cmd.Stderr = os.Stderr
	p := startProc(b, cmd)
	p.url = "nats://" + listen
	natstest.WaitFor(b, time.Minute, "the NATS server process up", func() bool {
		nc, err := nats.Connect(p.url)
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	return p
}

func startPlannerProc(b *testing.B, url, spec string) *proc {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	maddr := freeAddr(b)
	cmd := exec.Command(self, "serve", "--server", url, "--spec", spec, "--settle", "-1s", "--no-local-reporter",
		"--metrics-listen", maddr, "--log-level", "error")
	cmd.Env = append(os.Environ(), execEnv+"=1")
	if d := os.Getenv(plannerGODEBUGEnv); d != "" {
		cmd.Env = append(cmd.Env, "GODEBUG="+d)
	}
	cmd.Stderr = os.Stderr
	p := startProc(b, cmd)
	p.metrics = "http://" + maddr + "/metrics"
	return p
}

// waitPublished waits until the planner's replan that published a
// revision is done, every assignment of it acknowledged. It scrapes the
// metrics four times a second, uncompressed: a scrape costs the planner
// garbage (a gzip writer, a megabyte, each), and one every few
// milliseconds would raise the peak it measures.
func (p *proc) waitPublished(b *testing.B) {
	b.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	natstest.WaitEvery(b, 5*time.Minute, 250*time.Millisecond, "a revision published", func() bool {
		resp, err := hc.Get(p.metrics)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		text, _ := io.ReadAll(resp.Body)
		return metricValue(string(text), `poolplanner_inventory_change_to_publish_seconds_count{plan="default"}`) >= 1
	})
}

// memory is the process's peak resident set (VmHWM) and its resident
// set now (VmRSS), in bytes.
func (p *proc) memory(b *testing.B) (hwm, rss uint64) {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		for key, into := range map[string]*uint64{"VmHWM:": &hwm, "VmRSS:": &rss} {
			if v, ok := strings.CutPrefix(sc.Text(), key); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				*into = kb << 10
			}
		}
	}
	return hwm, rss
}

// procScaleSpec is the service's scale spec (internal/service's
// scaleSpec): fifteen sixteenths of n 8-GPU nodes filled, about 18
// workers a node.
func procScaleSpec(n int) string {
	gpus := 8 * (n - n/16)
	return fmt.Sprintf(`
scheduling:
  train:  {worker_num: %d, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: %d, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: %d, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`, gpus/4, gpus/16, gpus/2*4)
}

func procNode(i int) string { return fmt.Sprintf("node-%06d", i) }

// procNodeDoc is simulated node i's inventory document (8 H100s), the
// GPUs sick ones unhealthy.
func procNodeDoc(b *testing.B, i int, sick ...int) []byte {
	b.Helper()
	id := procNode(i)
	sim, _ := inventory.ParseSimulation("8xH100")
	inv := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}.Inventory()
	inv.GPUs = inventory.SimulatedGPUs(id, sim)
	for _, g := range sick {
		inv.GPUs[g].Healthy = false
	}
	doc, err := json.Marshal(inv)
	if err != nil {
		b.Fatal(err)
	}
	return doc
}

func procNodeDocs(b *testing.B, n int) [][]byte {
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = procNodeDoc(b, i)
	}
	return docs
}

// fillProcBucket puts the documents straight into the inventory bucket,
// as their reporters would, keys living an hour.
func fillProcBucket(b *testing.B, js jetstream.JetStream, docs [][]byte) {
	b.Helper()
	if _, err := store.NewInventoryStore(js).Ensure(context.Background()); err != nil {
		b.Fatal(err)
	}
	acks := make([]jetstream.PubAckFuture, 0, len(docs))
	wait := func(fs []jetstream.PubAckFuture) {
		for _, f := range fs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			case <-time.After(30 * time.Second):
				b.Fatal("no ack")
			}
		}
	}
	for i, doc := range docs {
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: bus.InventorySubject(procNode(i)), Data: doc}, jetstream.WithMsgTTL(bus.KeyTTL(time.Hour)))
		if err != nil {
			b.Fatal(err)
		}
		acks = append(acks, f)
		if len(acks) >= 512 {
			wait(acks[:1])
			acks = acks[1:]
		}
	}
	wait(acks)
}
