package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// execEnv, set in a test binary's environment, makes it the planner
// command: the load benchmark runs `planner serve` processes of its own,
// so that each server's CPU and memory can be read apart.
const execEnv = "POOLPLANNER_TEST_EXEC_PLANNER"

func TestMain(m *testing.M) {
	if os.Getenv(execEnv) != "" {
		// As cmd/planner's main: the context ends at SIGTERM (serve stops
		// in order on it, its lease released, so that the process
		// benchmark can restart it), and the heap profiles it asks for
		// with it.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		if path := os.Getenv(execHeapProfileEnv); path != "" {
			go profileHeapPeaks(ctx, path)
		}
		code := Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		if path := os.Getenv(execHeapProfileEnv); path != "" {
			// A profile counts what was allocated up to the last
			// collection: one now counts the run to its end.
			runtime.GC()
			writeHeapProfile(fmt.Sprintf("%s.%d.end", path, os.Getpid()))
		}
		os.Exit(code)
	}
	if spec := os.Getenv(execNATSEnv); spec != "" {
		os.Exit(runNATS(spec))
	}
	os.Exit(m.Run())
}

// serveProc is a `planner serve` process of the benchmark.
type serveProc struct {
	cmd *exec.Cmd
	url string
}

func startServe(b testing.TB, args ...string) *serveProc {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	listen := freeAddr(b)
	cmd := exec.Command(self, append([]string{"serve", "--listen", listen, "--no-local-reporter", "--log-level", "error"}, args...)...)
	cmd.Env = append(os.Environ(), execEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &serveProc{cmd: cmd, url: "nats://" + listen}
}

// usage is a process's CPU time so far and its resident memory now.
func (s *serveProc) usage(b *testing.B) (time.Duration, int64) {
	b.Helper()
	pid := s.cmd.Process.Pid
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	// Fields after the command name (which may hold spaces), from 3 on:
	// utime is field 14, stime 15, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	var rss int64
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			rss = kb << 10
		}
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, rss
}

// BenchmarkHeartbeats10k is the HA load test: 10,000 simulated 8-GPU
// nodes heartbeating every 5 s, from this process, against three
// clustered `planner serve` processes with R3 state (one of them leading
// the plan), and for comparison against one. Each iteration is one
// heartbeat round of 10,000 puts spread over 5 s. It reports the put
// latency (p50, p99), CPU (cores over the round) and resident memory of
// each server process (the leader's apart), and, once, the time from a
// node's last heartbeat to the revision without it, less its key's TTL.
//
// Run: go test -run '^$' -bench Heartbeats10k -benchtime 3x -timeout 20m ./internal/cli/
func BenchmarkHeartbeats10k(b *testing.B) {
	b.Run("servers=1", func(b *testing.B) { heartbeatLoad(b, 1) })
	b.Run("servers=3", func(b *testing.B) { heartbeatLoad(b, 3) })
}

const (
	hbNodes       = 10000
	loadBeat      = 5 * time.Second
	loadTTL       = 15 * time.Second
	loadPublisher = 256 // puts in flight
)

func heartbeatLoad(b *testing.B, servers int) {
	procs := startServes(b, servers)
	var urls []string
	for _, p := range procs {
		urls = append(urls, p.url)
	}
	nc, err := bus.Connect(strings.Join(urls, ","), "load", zerolog.Nop(), bus.Security{})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*loadPublisher))
	docs := make([][]byte, hbNodes)
	for i := range docs {
		id := fmt.Sprintf("node-%05d", i)
		sim, _ := inventory.ParseSimulation("8xH100")
		inv := inventory.Facts{NodeID: id, Hostname: id, IP: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), CPUs: 128}.Inventory()
		inv.GPUs = inventory.SimulatedGPUs(id, sim)
		if docs[i], err = json.Marshal(inv); err != nil {
			b.Fatal(err)
		}
	}
	waitStream(b, js, bus.InventoryStream, servers)
	round(b, js, docs, false, 0, nil) // every node reports
	waitPlan(b, js, "default")

	cpu0 := make([]time.Duration, servers)
	for i, p := range procs {
		cpu0[i], _ = p.usage(b)
	}
	var lat []time.Duration
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		round(b, js, docs, true, loadBeat, &lat)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "put-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "put-p99-ms")
	leader := leaderIndex(b, js, procs)
	var others []string
	for i, p := range procs {
		cpu, rss := p.usage(b)
		cores := (cpu - cpu0[i]).Seconds() / elapsed.Seconds()
		if i == leader {
			b.ReportMetric(cores, "leader-cores")
			b.ReportMetric(float64(rss>>20), "leader-MiB")
			continue
		}
		others = append(others, fmt.Sprintf("s%d %.2f cores %d MiB", i, cores, rss>>20))
	}
	if len(others) > 0 {
		b.Logf("standby servers: %s", strings.Join(others, "; "))
	}
	b.ReportMetric(deathToRevision(b, js, docs).Seconds(), "death-to-rev-s")
}

// startServes starts n clustered serve processes (n > 1: R3 state), the
// first with the spec.
func startServes(b *testing.B, n int) []*serveProc {
	dir := b.TempDir()
	routes := make([]string, n)
	for i := range routes {
		routes[i] = freeAddr(b)
	}
	var out []*serveProc
	for i := range n {
		args := []string{"--data-dir", filepath.Join(dir, strconv.Itoa(i)), "--spec", "../../examples/disaggregate.yaml",
			"--settle", "-1s", "--lease-ttl", "5s"}
		if n > 1 {
			var others []string
			for j, r := range routes {
				if j != i {
					others = append(others, "nats://"+r)
				}
			}
			args = append(args, "--replicas", strconv.Itoa(min(n, 3)), "--cluster-listen", routes[i], "--routes", strings.Join(others, ","))
		}
		out = append(out, startServe(b, args...))
	}
	return out
}

// round puts every document once (heartbeats: flagged as such), spread
// over spread, at most loadPublisher in flight; the latency of each put
// is appended to lat.
func round(b *testing.B, js jetstream.JetStream, docs [][]byte, heartbeat bool, spread time.Duration, lat *[]time.Duration) {
	b.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, loadPublisher)
	start := time.Now()
	var failed int
	for i, doc := range docs {
		if doc == nil {
			continue // not this round
		}
		if spread > 0 {
			if wait := time.Until(start.Add(spread * time.Duration(i) / time.Duration(len(docs)))); wait > 0 {
				time.Sleep(wait)
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			msg := &nats.Msg{Subject: bus.InventorySubject(fmt.Sprintf("node-%05d", i)), Header: nats.Header{}, Data: doc}
			if heartbeat {
				msg.Header.Set(bus.HeartbeatHeader, "1")
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(loadTTL))
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			if lat != nil {
				*lat = append(*lat, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	if failed > 0 {
		b.Fatalf("%d of %d puts failed", failed, len(docs))
	}
}

// waitStream waits until stream exists with the replicas wanted.
func waitStream(b *testing.B, js jetstream.JetStream, name string, servers int) {
	b.Helper()
	want := min(servers, 3)
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := js.Stream(ctx, name)
		cancel()
		if err == nil && st.CachedInfo().Config.Replicas == want {
			return
		}
	}
	b.Fatalf("stream %s with %d replicas did not appear", name, want)
}

// waitPlan waits for a valid plan and returns its revision.
func waitPlan(b *testing.B, js jetstream.JetStream, name string) int {
	b.Helper()
	plans := store.NewPlanStore(js)
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sp, err := plans.Latest(ctx, name)
		cancel()
		if err == nil && sp != nil && sp.Plan.Valid() {
			return sp.Plan.Revision
		}
	}
	b.Fatal("no valid plan")
	return 0
}

// leaderIndex is the index of the process that leads the plan.
func leaderIndex(b *testing.B, js jetstream.JetStream, procs []*serveProc) int {
	b.Helper()
	l, err := store.NewPlanStore(js).ReadLease(context.Background(), "default")
	if err != nil || l == nil {
		b.Fatalf("no leader: %v", err)
	}
	for i, p := range procs {
		if p.cmd.Process.Pid == l.PID {
			return i
		}
	}
	b.Fatalf("the leader (pid %d) is none of the serve processes", l.PID)
	return -1
}

// deathToRevision stops the heartbeats of a node holding workers while
// the others go on, and returns the time from its last heartbeat to the
// revision without it, less its key's TTL: what the planner adds to the
// TTL.
func deathToRevision(b *testing.B, js jetstream.JetStream, docs [][]byte) time.Duration {
	b.Helper()
	plans := store.NewPlanStore(js)
	sp, err := plans.Latest(context.Background(), "default")
	if err != nil || sp == nil {
		b.Fatalf("latest: %v", err)
	}
	victim := sp.Plan.Workers.At(0).NodeID
	vi, _ := strconv.Atoi(strings.TrimPrefix(victim, "node-"))
	rest := slices.Clone(docs)
	rest[vi] = nil // round skips it
	only := make([][]byte, len(docs))
	only[vi] = docs[vi]
	round(b, js, only, true, 0, nil)
	last := time.Now()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			round(b, js, rest, true, loadBeat, nil)
		}
	}()
	defer func() { close(done); <-stopped }()
	for time.Since(last) < 3*loadTTL {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sp, err := plans.Latest(ctx, "default")
		cancel()
		if err == nil && sp != nil && sp.Plan.Valid() && !onNode(sp.Plan.Workers.Slice(), victim) {
			return time.Since(last) - loadTTL
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("no revision without %s within %s", victim, 3*loadTTL)
	return 0
}

func onNode(ws []plan.Worker, node string) bool {
	for _, w := range ws {
		if w.NodeID == node {
			return true
		}
	}
	return false
}
