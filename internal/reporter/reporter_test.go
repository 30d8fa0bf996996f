package reporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// fakeSource is a simulated node whose GPUs can be made unhealthy, and
// whose reads can be made to fail.
type fakeSource struct {
	mu      sync.Mutex
	inv     inventory.NodeInventory
	failing int // fail this many reads
	changed chan struct{}
}

func newFakeSource(nodeID string) *fakeSource {
	sim, _ := inventory.ParseSimulation("8xH100")
	inv, _ := inventory.NewSimulated(inventory.Facts{NodeID: nodeID, IP: "10.0.0.1", CPUs: 64}, sim).Inventory(context.Background())
	return &fakeSource{inv: inv, changed: make(chan struct{}, 1)}
}

func (f *fakeSource) Inventory(context.Context) (inventory.NodeInventory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing > 0 {
		f.failing--
		return inventory.NodeInventory{}, errors.New("nvml DeviceGetCount: Unknown Error")
	}
	inv := f.inv
	inv.GPUs = append([]inventory.GPU(nil), f.inv.GPUs...)
	return inv, nil
}

func (f *fakeSource) Changed() <-chan struct{} { return f.changed }

func (f *fakeSource) breakGPU(i int) {
	f.mu.Lock()
	f.inv.GPUs[i].Healthy, f.inv.GPUs[i].UnhealthyReason = false, "XID 79"
	f.mu.Unlock()
	f.changed <- struct{}{}
}

func startServer(t *testing.T) *natstest.Server {
	t.Helper()
	return natstest.Start(t)
}

// client is a test's own view of the bucket.
func client(t *testing.T, url string) *store.InventoryStore {
	t.Helper()
	nc, err := bus.Connect(url, "test-watcher", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return store.NewInventoryStore(js)
}

type running struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// startReporter runs a reporter on its own connection, as a separate
// process would.
func startReporter(t *testing.T, url string, src inventory.Source, heartbeat, ttl time.Duration) *running {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
	// The connection logs from its own goroutines, possibly after the
	// test has ended, which testing forbids; keep it quiet.
	nc, err := bus.Connect(url, "reporter", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- Run(ctx, Config{Source: src, Store: store.NewInventoryStore(js), Heartbeat: heartbeat, TTL: ttl, Log: log})
	}()
	t.Cleanup(func() { r.stop(t); nc.Close() })
	return r
}

func (r *running) stop(t *testing.T) {
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil // let a second stop return too
	case <-time.After(5 * time.Second):
		t.Error("Run did not return after cancel")
	}
}

// kill stops the reporter the way SIGKILL would: its connection goes
// first, so it cannot say goodbye.
func (r *running) kill(t *testing.T) {
	r.nc.Close()
	r.stop(t)
}

func watch(t *testing.T, s *store.InventoryStore) <-chan store.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

// next returns the next event that is not a heartbeat or sync.
func next(t *testing.T, events <-chan store.Event, within time.Duration) store.Event {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev := <-events:
			if ev.Op == store.Heartbeat || ev.Op == store.Synced {
				continue
			}
			return ev
		case <-deadline:
			t.Fatalf("no event within %s", within)
		}
	}
}

func waitForKey(t *testing.T, s *store.InventoryStore, nodeID string, within time.Duration, ok func(inventory.NodeInventory) bool) inventory.NodeInventory {
	t.Helper()
	var inv inventory.NodeInventory
	natstest.WaitFor(t, within, "key "+nodeID+" as wanted", func() bool {
		var err error
		inv, _, err = s.Get(context.Background(), nodeID)
		return err == nil && (ok == nil || ok(inv))
	})
	return inv
}

func TestConfigValidate(t *testing.T) {
	src, kvs := newFakeSource("n1"), store.NewInventoryStore(nil)
	tests := []struct {
		heartbeat, ttl time.Duration
		wantErr        string
	}{
		{heartbeat: 5 * time.Second, ttl: 15 * time.Second},
		{heartbeat: 200 * time.Millisecond, ttl: time.Second},
		{heartbeat: 0, ttl: time.Second, wantErr: "heartbeat 0s: must be positive"},
		{heartbeat: 100 * time.Millisecond, ttl: 500 * time.Millisecond, wantErr: "at least 1s"},
		{heartbeat: 5 * time.Second, ttl: 5 * time.Second, wantErr: "longer than the heartbeat"},
	}
	for _, tt := range tests {
		err := Config{Source: src, Store: kvs, Heartbeat: tt.heartbeat, TTL: tt.ttl}.Validate()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("heartbeat %s ttl %s: error %v, want %q", tt.heartbeat, tt.ttl, err, tt.wantErr)
		}
	}
}

// The key appears, survives well past its TTL while heartbeats flow, and
// heartbeats reach a watcher as heartbeats, not changes.
func TestKeyAppearsAndSurvivesTTL(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	events := watch(t, kvs)
	startReporter(t, srv.URL(), newFakeSource("n1"), 200*time.Millisecond, time.Second)

	ev := next(t, events, 5*time.Second)
	if ev.Op != store.Changed || ev.NodeID != "n1" || len(ev.Inventory.GPUs) != 8 {
		t.Fatalf("first event %+v", ev)
	}
	var beats int
	deadline := time.After(3 * time.Second) // three TTLs
	for done := false; !done; {
		select {
		case ev := <-events:
			if ev.Op != store.Heartbeat {
				t.Fatalf("event %v %s while heartbeats flow, want only heartbeats", ev.Op, ev.Reason)
			}
			beats++
		case <-deadline:
			done = true
		}
	}
	if beats < 5 {
		t.Errorf("%d heartbeats in 3s at 200ms", beats)
	}
	waitForKey(t, kvs, "n1", 0, nil)
}

// A reporter killed without a word: its key is purged within the TTL and
// watchers, plain KV ones included, see the purge.
func TestKilledReporterIsPurged(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	events := watch(t, kvs)
	r := startReporter(t, srv.URL(), newFakeSource("n1"), 200*time.Millisecond, time.Second)
	if ev := next(t, events, 5*time.Second); ev.Op != store.Changed {
		t.Fatalf("first event %+v", ev)
	}
	r.kill(t)
	killed := time.Now()
	// TTL 1s, plus up to one heartbeat already in flight, plus the
	// server's expiry tick.
	ev := next(t, events, 3*time.Second)
	if ev.Op != store.Removed || ev.Reason != store.ReasonExpired {
		t.Fatalf("event %+v, want removed/expired", ev)
	}
	t.Logf("expired %s after the kill (TTL 1s)", time.Since(killed).Round(10*time.Millisecond))
	kv, _ := kvs.KV(context.Background())
	if _, err := kv.Get(context.Background(), "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the dead node's key is still there: %v", err)
	}
}

// On shutdown (what SIGTERM triggers in the command) the key goes at once.
func TestShutdownDeletesKey(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	events := watch(t, kvs)
	r := startReporter(t, srv.URL(), newFakeSource("n1"), 5*time.Second, 15*time.Second)
	if ev := next(t, events, 5*time.Second); ev.Op != store.Changed {
		t.Fatalf("first event %+v", ev)
	}
	r.stop(t)
	if _, _, err := kvs.Get(context.Background(), "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("Get after shutdown: %v, want ErrKeyNotFound", err)
	}
	if ev := next(t, events, time.Second); ev.Op != store.Removed || ev.Reason != store.ReasonDeleted {
		t.Errorf("event %+v, want removed/deleted", ev)
	}
}

// A GPU turning unhealthy is published at once, not at the next heartbeat.
func TestChangePublishedAtOnce(t *testing.T) {
	srv := startServer(t)
	kvs := client(t, srv.URL())
	events := watch(t, kvs)
	src := newFakeSource("n1")
	startReporter(t, srv.URL(), src, 30*time.Second, time.Minute)
	first := next(t, events, 5*time.Second)
	if first.Op != store.Changed {
		t.Fatalf("first event %+v", first)
	}
	src.breakGPU(3)
	ev := next(t, events, time.Second)
	if ev.Op != store.Changed || ev.Inventory.GPUs[3].Healthy || ev.Inventory.GPUs[3].UnhealthyReason != "XID 79" {
		t.Fatalf("event %+v, want GPU 3 unhealthy", ev)
	}
	if len(ev.Inventory.HealthyGPUs()) != 7 || !ev.Inventory.ReportedAt.After(first.Inventory.ReportedAt) {
		t.Errorf("healthy %d, reported_at %v after %v", len(ev.Inventory.HealthyGPUs()), ev.Inventory.ReportedAt, first.Inventory.ReportedAt)
	}
	// A Changed signal with nothing changed puts nothing.
	src.changed <- struct{}{}
	select {
	case ev := <-events:
		t.Errorf("event %v after a no-op change signal", ev.Op)
	case <-time.After(300 * time.Millisecond):
	}
}

// The server goes away mid-run and comes back (same port and storage, or
// storage lost); a GPU breaks while it is away. Nothing is lost.
func TestServerRestartLosesNothing(t *testing.T) {
	for _, lose := range []bool{false, true} {
		name := "storage kept"
		if lose {
			name = "storage lost"
		}
		t.Run(name, func(t *testing.T) {
			srv := startServer(t)
			src := newFakeSource("n1")
			startReporter(t, srv.URL(), src, 200*time.Millisecond, 2*time.Second)
			waitForKey(t, client(t, srv.URL()), "n1", 5*time.Second, nil)

			srv.Stop()
			src.breakGPU(5)
			// The outage is the scenario: a span with the server away
			// while the GPU breaks and the reporter tries to report it.
			time.Sleep(500 * time.Millisecond)
			if lose {
				srv.Wipe()
			} else {
				srv.Start()
			}
			inv := waitForKey(t, client(t, srv.URL()), "n1", 10*time.Second, func(inv inventory.NodeInventory) bool {
				return !inv.GPUs[5].Healthy
			})
			if len(inv.GPUs) != 8 || len(inv.HealthyGPUs()) != 7 {
				t.Errorf("after restart: %d GPUs, %d healthy", len(inv.GPUs), len(inv.HealthyGPUs()))
			}
		})
	}
}

// NATS down when the reporter starts, and the source failing at first:
// the report arrives once both recover.
func TestNATSDownAtStart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	src := newFakeSource("n1")
	src.failing = 2
	startReporter(t, fmt.Sprintf("nats://127.0.0.1:%d", port), src, 200*time.Millisecond, time.Second)
	natstest.WaitFor(t, 10*time.Second, "the source's failing reads tried", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.failing == 0
	})

	srv := natstest.Start(t, natstest.Port(port))
	waitForKey(t, client(t, srv.URL()), "n1", 10*time.Second, nil)
}

// TestTwoReportersOneNode: two reporters given one node id do not
// overwrite each other for ever. One started on another host while the
// first holds the key stops at once, naming that host and pid; so does
// one started on the same host while the first runs (here: in this
// process), and the first keeps the key.
func TestTwoReportersOneNode(t *testing.T) {
	on := func(host string) *fakeSource {
		src := newFakeSource("n1")
		src.inv.Hostname = host
		return src
	}
	wait := func(r *running) error {
		t.Helper()
		select {
		case err := <-r.done:
			r.done <- nil // for the cleanup's stop
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("the second reporter did not stop")
			return nil
		}
	}
	t.Run("another host", func(t *testing.T) {
		srv := startServer(t)
		kvs := client(t, srv.URL())
		startReporter(t, srv.URL(), on("h1"), 100*time.Millisecond, time.Second)
		waitForKey(t, kvs, "n1", 5*time.Second, func(inv inventory.NodeInventory) bool { return inv.Hostname == "h1" })
		b := startReporter(t, srv.URL(), on("h2"), 100*time.Millisecond, time.Second)
		err := wait(b)
		if !errors.Is(err, ErrOtherReporter) || !strings.Contains(err.Error(), "host h1") || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
			t.Fatalf("second reporter: %v", err)
		}
		// The first reporter keeps the key: a heartbeat of its own
		// after the second stopped.
		_, rev, err := kvs.Get(context.Background(), "n1")
		if err != nil {
			t.Fatal(err)
		}
		natstest.WaitFor(t, 5*time.Second, "a heartbeat of the first reporter", func() bool {
			inv, now, err := kvs.Get(context.Background(), "n1")
			if err == nil && now > rev && inv.Hostname != "h1" {
				t.Fatalf("the key is host %q's", inv.Hostname)
			}
			return err == nil && now > rev
		})
	})
	t.Run("same host", func(t *testing.T) {
		srv := startServer(t)
		kvs := client(t, srv.URL())
		a := startReporter(t, srv.URL(), on("h1"), 100*time.Millisecond, time.Second)
		first := waitForKey(t, kvs, "n1", 5*time.Second, func(inv inventory.NodeInventory) bool { return inv.Reporter != "" })
		b := startReporter(t, srv.URL(), on("h1"), 100*time.Millisecond, time.Second)
		err := wait(b)
		if !errors.Is(err, ErrOtherReporter) || !strings.Contains(err.Error(), "running in this process") {
			t.Fatalf("second reporter: %v", err)
		}
		select {
		case err := <-a.done:
			t.Fatalf("the first reporter stopped: %v", err)
		default:
		}
		if inv := waitForKey(t, kvs, "n1", 0, nil); inv.Reporter != first.Reporter {
			t.Errorf("the key is reporter %s's, want the first's, %s", inv.Reporter, first.Reporter)
		}
	})
}
