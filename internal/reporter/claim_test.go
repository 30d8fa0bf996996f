package reporter

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/store"
)

// startWith runs a reporter as startReporter does, with edit applied to
// its configuration (its PID, the liveness of other pids).
func startWith(t *testing.T, url string, src inventory.Source, heartbeat, ttl time.Duration, edit func(*Config)) *running {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
	nc, err := bus.Connect(url, "reporter", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	cfg := Config{Source: src, Store: store.NewInventoryStore(js), Heartbeat: heartbeat, TTL: ttl, Log: log}
	edit(&cfg)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Run(ctx, cfg) }()
	t.Cleanup(func() { r.stop(t); nc.Close() })
	return r
}

// ended is the reporter's Run error once it returned by itself.
func ended(t *testing.T, r *running, within time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- nil // for the cleanup's stop
		return err
	case <-time.After(within):
		t.Fatal("the reporter did not stop")
		return nil
	}
}

// stillRunning fails the test if r's Run has returned.
func stillRunning(t *testing.T, r *running, what string) {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		t.Fatalf("%s stopped: %v", what, err)
	default:
	}
}

// hostSource is node n1 on host.
func hostSource(host string) *fakeSource {
	src := newFakeSource("n1")
	src.inv.Hostname = host
	return src
}

func pids(alive ...int) func(int) bool {
	return func(pid int) bool {
		for _, p := range alive {
			if p == pid {
				return true
			}
		}
		return false
	}
}

// writeOther stores doc under its node's key as another writer would,
// over whatever the key holds, and returns the revision.
func writeOther(t *testing.T, kvs *store.InventoryStore, doc inventory.NodeInventory, ttl time.Duration) uint64 {
	t.Helper()
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kvs.Put(context.Background(), doc.NodeID, data, false, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// A second reporter of the same host while the first's pid runs: it
// refuses, naming the host and the first's pid and when the key would
// expire; the first keeps reporting, its key untouched, and deletes it
// when it stops.
func TestSecondReporterOfLiveNodeRefused(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	a := startWith(t, srv.URL(), hostSource("gpu-07"), 100*time.Millisecond, 30*time.Second, func(c *Config) { c.PID, c.Alive = 1001, pids(1001) })
	first := waitForKey(t, kvs, "n1", 5*time.Second, func(inv inventory.NodeInventory) bool { return inv.ReporterPID == 1001 })

	b := startWith(t, srv.URL(), hostSource("gpu-07"), 100*time.Millisecond, 30*time.Second, func(c *Config) { c.PID, c.Alive = 1002, pids(1001, 1002) })
	err := ended(t, b, 5*time.Second)
	if !errors.Is(err, ErrOtherReporter) {
		t.Fatalf("second reporter: %v, want ErrOtherReporter", err)
	}
	for _, want := range []string{"node n1", "host gpu-07", "ip 10.0.0.1", "pid 1001", "pid 1001 is running on this host", "the key expires at ", "give each host its own --node-id"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	_, refused, _ := kvs.Get(context.Background(), "n1")
	// The first keeps reporting: its heartbeats move the key on, and the
	// key stays its.
	inv := waitForKey(t, kvs, "n1", 5*time.Second, func(inv inventory.NodeInventory) bool {
		_, rev, _ := kvs.Get(context.Background(), "n1")
		return rev > refused+2
	})
	if inv.Reporter != first.Reporter || inv.ReporterPID != 1001 {
		t.Errorf("the key is reporter %s pid %d's, want the first's (%s, 1001)", inv.Reporter, inv.ReporterPID, first.Reporter)
	}
	stillRunning(t, a, "the first reporter")
	a.stop(t)
	if _, _, err := kvs.Get(context.Background(), "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after the first reporter stopped: %v, want the key deleted", err)
	}
}

// A reporter restarted after its predecessor died (its pid gone, its key
// not yet expired) takes the key over at once, without the node leaving.
func TestPredecessorDiedTakesOver(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	events := watch(t, kvs)
	a := startWith(t, srv.URL(), newFakeSource("n1"), 100*time.Millisecond, 30*time.Second, func(c *Config) { c.PID = 1001 })
	if ev := next(t, events, 5*time.Second); ev.Op != store.Changed || ev.Inventory.ReporterPID != 1001 {
		t.Fatalf("first event %+v", ev)
	}
	a.kill(t)

	start := time.Now()
	b := startWith(t, srv.URL(), newFakeSource("n1"), 100*time.Millisecond, 30*time.Second, func(c *Config) { c.PID, c.Alive = 1002, pids(1002) })
	ev := next(t, events, 5*time.Second)
	if ev.Op != store.Changed || ev.Inventory.ReporterPID != 1002 {
		t.Fatalf("event %v %s (pid %d), want the new reporter's document", ev.Op, ev.Reason, ev.Inventory.ReporterPID)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took over after %s: that is the TTL's doing, not the takeover's", time.Since(start))
	}
	stillRunning(t, b, "the new reporter")
}

// A document of this host, of this process's pid, but of no reporter
// running in this process: a previous process that had the pid (a
// container's reporter is pid 1 every time). It is taken over.
func TestSamePIDOfAPreviousProcessTakesOver(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	old := newFakeSource("n1").inv
	old.Reporter, old.ReporterPID = "previous-instance", os.Getpid()
	writeOther(t, kvs, old, 30*time.Second)
	startReporter(t, srv.URL(), newFakeSource("n1"), 100*time.Millisecond, 30*time.Second)
	waitForKey(t, kvs, "n1", 5*time.Second, func(inv inventory.NodeInventory) bool {
		return inv.Reporter != "previous-instance" && inv.ReporterPID == os.Getpid()
	})
}

// A document of this host without a pid (an older reporter's): whether
// it runs cannot be told, so the reporter refuses and says when the key
// expires.
func TestNoPIDRefusedUntilTTL(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	old := newFakeSource("n1").inv
	old.Reporter = "older-reporter"
	rev := writeOther(t, kvs, old, 30*time.Second)
	r := startReporter(t, srv.URL(), newFakeSource("n1"), 100*time.Millisecond, 30*time.Second)
	err := ended(t, r, 5*time.Second)
	if !errors.Is(err, ErrOtherReporter) || !strings.Contains(err.Error(), "pid unknown") || !strings.Contains(err.Error(), "it wrote no pid") ||
		!strings.Contains(err.Error(), "the key expires at ") {
		t.Fatalf("reporter: %v", err)
	}
	if inv, now, err := kvs.Get(context.Background(), "n1"); err != nil || now != rev || inv.Reporter != "older-reporter" {
		t.Errorf("the key: %v, revision %d (was %d), reporter %q", err, now, rev, inv.Reporter)
	}
}

// A running reporter whose key another live reporter overwrote stops,
// naming it, and leaves that reporter's key alone.
func TestOverwrittenReporterStopsWithoutDeleting(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	r := startReporter(t, srv.URL(), newFakeSource("n1"), 100*time.Millisecond, 30*time.Second)
	waitForKey(t, kvs, "n1", 5*time.Second, nil)
	other := newFakeSource("n1").inv
	other.Hostname, other.Reporter, other.ReporterPID = "h2", "other-instance", 77
	rev := writeOther(t, kvs, other, 30*time.Second)
	err := ended(t, r, 5*time.Second)
	if !errors.Is(err, ErrOtherReporter) || !strings.Contains(err.Error(), "host h2") || !strings.Contains(err.Error(), "pid 77") {
		t.Fatalf("reporter: %v", err)
	}
	if inv, now, err := kvs.Get(context.Background(), "n1"); err != nil || now != rev || inv.Reporter != "other-instance" {
		t.Errorf("the key after the reporter stopped: %v, revision %d (was %d), reporter %q", err, now, rev, inv.Reporter)
	}
}

// On shutdown a reporter deletes the key only if the last write is its
// own: a key another writer wrote since (its revision moved) stays.
func TestShutdownLeavesAnotherWritersKey(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	// No heartbeat before the stop: the reporter does not notice the
	// overwrite until it shuts down.
	r := startReporter(t, srv.URL(), newFakeSource("n1"), time.Minute, 2*time.Minute)
	waitForKey(t, kvs, "n1", 5*time.Second, nil)
	other := newFakeSource("n1").inv
	other.Hostname, other.Reporter, other.ReporterPID = "h2", "other-instance", 77
	rev := writeOther(t, kvs, other, 30*time.Second)
	r.stop(t)
	if inv, now, err := kvs.Get(context.Background(), "n1"); err != nil || now != rev || inv.Reporter != "other-instance" {
		t.Errorf("the key after shutdown: %v, revision %d (was %d), reporter %q; want it left alone", err, now, rev, inv.Reporter)
	}
}

// The document carries the pid, bounded by Validate.
func TestReporterPIDValidated(t *testing.T) {
	inv := newFakeSource("n1").inv
	for _, c := range []struct {
		pid int
		ok  bool
	}{{0, true}, {1, true}, {inventory.MaxPID, true}, {-1, false}} {
		inv.ReporterPID = c.pid
		if err := inv.Validate(); (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "reporter_pid") {
			t.Errorf("reporter_pid %d: %v", c.pid, err)
		}
	}
	if inv.ReporterPID = 5; !inventory.SameInventory(inv, newFakeSource("n1").inv) {
		t.Error("a new reporter pid reads as an inventory change")
	}
}

// ProcessAlive: this process runs; a child that exited and was reaped
// does not.
func TestProcessAlive(t *testing.T) {
	if !ProcessAlive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Skipf("no /bin/true: %v", err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if ProcessAlive(p.Pid) {
		t.Errorf("pid %d, reaped, is alive", p.Pid)
	}
	if ProcessAlive(0) || ProcessAlive(-1) {
		t.Error("pid 0 or -1 is alive")
	}
}
