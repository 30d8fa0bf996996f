// Package testcluster starts NATS clusters of embedded servers on
// loopback for tests: servers that can be stopped without warning and
// started again on the same ports and storage.
package testcluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// Cluster is n embedded servers routed to each other.
type Cluster struct {
	t        testing.TB
	dir      string
	auth     *auth.Authority
	clients  []string // client HOST:PORT
	clusters []string // cluster HOST:PORT
	mu       sync.Mutex
	servers  []*server.Server
	// maxStore bounds each server's JetStream file storage (0: none).
	maxStore int64
}

// Start starts n servers clustered on loopback, each with its own
// storage under a temp dir; a with auth, nil without. It waits until
// JetStream has a meta leader.
func Start(t testing.TB, n int, a *auth.Authority) *Cluster {
	t.Helper()
	return StartLimited(t, n, a, 0)
}

// StartLimited is Start with each server's JetStream file storage
// bounded to maxStore bytes, as a modest server's max_file_store does.
func StartLimited(t testing.TB, n int, a *auth.Authority, maxStore int64) *Cluster {
	t.Helper()
	return start(t, n, n, a, maxStore)
}

// StartForming is a cluster of n servers of which only the first up
// have started (the others start with StartServer): a cluster still
// forming, whose missing servers its members have never seen.
func StartForming(t testing.TB, n, up int, a *auth.Authority) *Cluster {
	t.Helper()
	return start(t, n, up, a, 0)
}

func start(t testing.TB, n, up int, a *auth.Authority, maxStore int64) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir(), auth: a, servers: make([]*server.Server, n), maxStore: maxStore}
	addrs := freeAddrs(t, 2*n)
	c.clients, c.clusters = addrs[:n], addrs[n:]
	for i := range up {
		c.StartServer(i)
	}
	t.Cleanup(func() {
		for i := range n {
			c.StopServer(i)
		}
	})
	c.WaitReady(30 * time.Second)
	return c
}

// freeAddrs picks n distinct free loopback ports, holding each open
// until all are picked so that none is picked twice.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out = append(out, "127.0.0.1:"+strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return out
}

// Routes are the cluster addresses of the servers other than i.
func (c *Cluster) Routes(i int) []string {
	var out []string
	for j, a := range c.clusters {
		if j != i {
			out = append(out, "nats://"+a)
		}
	}
	return out
}

// StartServer starts server i (again), on its ports and storage.
func (c *Cluster) StartServer(i int) {
	c.t.Helper()
	ns, _, err := bus.StartEmbedded(bus.EmbeddedOptions{Listen: c.clients[i], StoreDir: filepath.Join(c.dir, strconv.Itoa(i)),
		Auth: c.auth, ClusterListen: c.clusters[i], Routes: c.Routes(i), ServerName: fmt.Sprintf("s%d", i), ReadyTimeout: 30 * time.Second,
		MaxFileStore: c.maxStore})
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.servers[i] = ns
	c.mu.Unlock()
}

// StopServer stops server i at once (as kill -9 would, as far as its
// peers and clients can tell: no lame-duck mode, connections dropped).
func (c *Cluster) StopServer(i int) {
	c.mu.Lock()
	ns := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// WaitCurrent waits until every replica of stream is current, so that
// losing one server loses nothing.
func WaitCurrent(ctx context.Context, t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	for {
		st, err := js.Stream(ctx, stream)
		if err == nil {
			info := st.CachedInfo()
			ok := info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == info.Config.Replicas-1
			for _, r := range info.Cluster.Replicas {
				ok = ok && r.Current
			}
			if ok {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("stream %s: replicas not current: %v", stream, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URLs is every server's client URL, comma-separated, as clients take it.
func (c *Cluster) URLs() string {
	var out []string
	for _, a := range c.clients {
		out = append(out, "nats://"+a)
	}
	return strings.Join(out, ",")
}

// URL is server i's client URL.
func (c *Cluster) URL(i int) string { return "nats://" + c.clients[i] }

// WaitReady waits until the running servers have a JetStream meta
// leader and every one of them is current with it.
func (c *Cluster) WaitReady(within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		leaders, current, running := 0, 0, 0
		c.mu.Lock()
		for _, ns := range c.servers {
			if ns == nil {
				continue
			}
			running++
			if ns.JetStreamIsLeader() {
				leaders++
			}
			if ns.JetStreamIsCurrent() {
				current++
			}
		}
		c.mu.Unlock()
		if leaders == 1 && current == running {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no JetStream meta leader")
}

// State describes each running server's view of JetStream: whether it
// is the meta leader, and per stream its leader and replicas, for a
// failing test to print.
func (c *Cluster) State() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for i, ns := range c.servers {
		if ns == nil {
			fmt.Fprintf(&b, "s%d: down\n", i)
			continue
		}
		fmt.Fprintf(&b, "s%d: meta leader %v current %v routes %d\n", i, ns.JetStreamIsLeader(), ns.JetStreamIsCurrent(), ns.NumRoutes())
		jsz, err := ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
		if err != nil {
			fmt.Fprintf(&b, "  jsz: %v\n", err)
			continue
		}
		if jsz.Meta != nil {
			fmt.Fprintf(&b, "  meta: leader %s peers %d\n", jsz.Meta.Leader, len(jsz.Meta.Replicas))
		}
		for _, a := range jsz.AccountDetails {
			for _, st := range a.Streams {
				fmt.Fprintf(&b, "  stream %s:", st.Name)
				if st.Cluster != nil {
					fmt.Fprintf(&b, " leader %q", st.Cluster.Leader)
					for _, r := range st.Cluster.Replicas {
						fmt.Fprintf(&b, " %s(current %v offline %v)", r.Name, r.Current, r.Offline)
					}
				}
				fmt.Fprintf(&b, " msgs %d\n", st.State.Msgs)
			}
		}
	}
	return b.String()
}

// Index is the index of the server whose client URL is url, -1 if none.
func (c *Cluster) Index(url string) int {
	for i := range c.clients {
		if c.URL(i) == url {
			return i
		}
	}
	return -1
}
