package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

// serveInProcess runs `planner serve` in this process on a free port,
// with its own data directory and args, until the test ends; it returns
// the server's URL and serve's stderr.
func serveInProcess(t *testing.T, args ...string) (string, *syncWriter) {
	t.Helper()
	addr := freeAddr(t)
	serveErr, _ := runServe(t, append([]string{"--listen", addr, "--data-dir", filepath.Join(t.TempDir(), "data")}, args...)...)
	return "nats://" + addr, serveErr
}

// runServe runs `planner serve args...` in this process (logging errors
// only) until the test ends; it returns serve's stderr and its exit
// code once it ends.
func runServe(t *testing.T, args ...string) (*syncWriter, <-chan int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	exited := make(chan int, 1)
	serveErr := &syncWriter{}
	all := append([]string{"serve", "--log-level", "error"}, args...)
	go func() {
		code := Main(ctx, all, nil, &bytes.Buffer{}, serveErr)
		done <- code
		exited <- code
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	return serveErr, exited
}

// dialRetry connects to url, retrying until the server (started in the
// background) is up.
func dialRetry(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// simulatedNode reports node id (8 simulated H100s, busy as given)
// into url's inventory until the test ends, and returns its source, so
// that the test can set which GPUs run processes.
func simulatedNode(t *testing.T, url, id string, busy []int) *inventory.Simulated {
	t.Helper()
	js, _ := jetstream.New(dialRetry(t, url))
	sim, _ := inventory.ParseSimulation("8xH100")
	src := inventory.NewSimulated(sim.Host(inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1"}), sim)
	if err := src.SetBusy(busy); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = reporter.Run(ctx, reporter.Config{Source: src, Store: store.NewInventoryStore(js), Heartbeat: time.Second, TTL: 5 * time.Second, Log: zerolog.Nop()})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return src
}
