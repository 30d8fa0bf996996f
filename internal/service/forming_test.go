package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/testcluster"
)

// TestStartWaitsForFormingCluster: a planner with --replicas 3 started
// while the third NATS server has not joined yet (a compose file
// starting everything at once) is refused for want of servers, in words
// the server also uses for a cluster that is too small. It retries
// (counted, cause forming) and starts once the third server is up,
// rather than exiting "not enough servers".
func TestStartWaitsForFormingCluster(t *testing.T) {
	t.Parallel()
	c := testcluster.StartForming(t, 3, 2, nil)
	p, js, reg := clusterPlanner(t, c.URL(0), Config{Replicas: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitScraped(t, reg, "a start retried while the cluster forms", func(m map[string]float64) bool {
		return m[`poolplanner_start_retries_total{cause="forming"}`] > 0
	})
	select {
	case err := <-done:
		t.Fatalf("the planner gave up on a forming cluster: %v", err)
	default:
	}
	c.StartServer(2)
	natstest.WaitFor(t, 60*time.Second, "the plan stream made with 3 replicas", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the planner ended: %v", err)
		default:
		}
		st, err := js.Stream(ctx, client.PlansStream)
		return err == nil && st.CachedInfo().Config.Replicas == 3
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("planner: %v", err)
	}
}

// TestStartGivesUpOnTooFewServers: more replicas than the cluster will
// ever have is still an error at start, once the first minute (by the
// service's clock) has shown no more servers joining; the error says so.
func TestStartGivesUpOnTooFewServers(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3, nil)
	clock := &stepClock{now: time.Unix(1_000_000, 0)}
	p, _, reg := clusterPlanner(t, c.URL(0), Config{Replicas: 5, Clock: clock})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := p.Run(ctx)
	if !errors.Is(err, bus.ErrReplicas) || !strings.Contains(err.Error(), "no more servers joined") {
		t.Fatalf("Run = %v, want not enough servers, said after the wait", err)
	}
	if got := scraped(t, reg)[`poolplanner_start_retries_total{cause="forming"}`]; got < 1 {
		t.Errorf("forming retries counted %v, want some", got)
	}
	if elapsed := clock.Now().Sub(time.Unix(1_000_000, 0)); elapsed < bus.StartGrace {
		t.Errorf("gave up %s after start, before the grace of %s", elapsed, bus.StartGrace)
	}
}

// clusterPlanner is a planner on the server at url with cfg (its spec
// testSpec, its metrics on reg), not yet run; its connection closes
// with the test.
func clusterPlanner(t *testing.T, url string, cfg Config) (*Service, jetstream.JetStream, *prometheus.Registry) {
	t.Helper()
	nc, err := bus.Connect(url, "planner", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	reg := prometheus.NewRegistry()
	cfg.NC, cfg.JS, cfg.Spec, cfg.Log, cfg.Metrics = nc, js, []byte(testSpec), zerolog.Nop(), metrics.NewPlanner(reg)
	return New(cfg), js, reg
}

// stepClock is a Clock whose every timer is due at once, moving the
// clock to it: waits take no wall time. Locked, for the service's
// goroutines.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	c.mu.Unlock()
	t := &stepTimer{c: make(chan time.Time, 1)}
	t.c <- now
	return t
}

type stepTimer struct{ c chan time.Time }

func (t *stepTimer) C() <-chan time.Time      { return t.c }
func (t *stepTimer) Stop() bool               { return false }
func (t *stepTimer) Reset(time.Duration) bool { return false }
