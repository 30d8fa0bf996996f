package store

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// BenchmarkHeartbeatRound10k measures one heartbeat round of 10,000
// simulated 8-GPU nodes (what the server sees every 5 s at the default
// --heartbeat): 10,000 heartbeat puts, acknowledged, and delivered to two
// watchers, a plain KV watcher (full values, any NATS client) and
// InventoryStore.Watch (headers only). It reports per round:
//
//	msgs/round          puts stored
//	kvwatch-B/round     bytes a plain KV watcher receives
//	hdrwatch-B/round    bytes Watch receives
//	cpu-ms/round        CPU of the whole process: server, publisher and
//	                    both watchers (an upper bound on the server's share)
//	cores@5s            cpu-ms/round spread over a 5 s heartbeat
//
// Run: go test -run '^$' -bench HeartbeatRound10k -benchtime 5x ./internal/bus/
func BenchmarkHeartbeatRound10k(b *testing.B) {
	const nodes = 10000
	_, url := startServer(b)
	nc, js := connect(b, url)
	ctx := context.Background()
	store := NewInventoryStore(js)
	if _, err := store.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	docs := make([][]byte, nodes)
	for i := range docs {
		docs[i] = testDoc(b, fmt.Sprintf("node-%05d", i))
	}
	publish := func(heartbeat bool) {
		for i, doc := range docs {
			msg := &nats.Msg{Subject: bus.InventorySubject(fmt.Sprintf("node-%05d", i)), Header: nats.Header{}, Data: doc}
			if heartbeat {
				msg.Header.Set(bus.HeartbeatHeader, "1")
			}
			if _, err := js.PublishMsgAsync(msg, jetstream.WithMsgTTL(bus.KeyTTL(time.Minute))); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("acks did not arrive")
		}
	}
	publish(false) // every node reports its inventory once

	// Watchers on their own connections, whose bytes off the wire
	// (protocol lines included) are counted.
	var kvWire, hdrWire atomic.Int64
	kvConn, kvJS := countingConnect(b, url, &kvWire)
	kv, err := kvJS.KeyValue(ctx, client.InventoryBucket)
	if err != nil {
		b.Fatal(err)
	}
	kvw, err := kv.WatchAll(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer kvw.Stop()
	var kvSeen atomic.Int64
	go func() {
		for e := range kvw.Updates() {
			if e != nil {
				kvSeen.Add(1)
			}
		}
	}()
	hdrConn, hdrJS := countingConnect(b, url, &hdrWire)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := NewInventoryStore(hdrJS).Watch(wctx)
	if err != nil {
		b.Fatal(err)
	}
	var hdrSeen, changes atomic.Int64
	go func() {
		for ev := range events {
			switch ev.Op {
			case Heartbeat, Changed:
				hdrSeen.Add(1)
				if ev.Op == Changed {
					changes.Add(1)
				}
			}
		}
	}()
	waitFor := func(want int64) {
		deadline := time.Now().Add(2 * time.Minute)
		for kvSeen.Load() < want || hdrSeen.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("watchers saw %d and %d of %d", kvSeen.Load(), hdrSeen.Load(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(nodes) // the initial state

	kvIn, hdrIn := kvWire.Load(), hdrWire.Load()
	changesBefore := changes.Load()
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		publish(true)
		waitFor(int64(nodes * (i + 2)))
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	n := float64(b.N)
	b.ReportMetric(nodes, "msgs/round")
	b.ReportMetric(float64(kvWire.Load()-kvIn)/n, "kvwatch-B/round")
	b.ReportMetric(float64(hdrWire.Load()-hdrIn)/n, "hdrwatch-B/round")
	b.ReportMetric(float64(kvConn.Stats().InMsgs+hdrConn.Stats().InMsgs)/(n+1)/2, "watcher-msgs/round")
	b.ReportMetric(float64(cpu.Milliseconds())/n, "cpu-ms/round")
	b.ReportMetric(cpu.Seconds()/n/5, "cores@5s")
	if c := changes.Load() - changesBefore; c != 0 {
		b.Errorf("Watch reported %d heartbeats as changes", c)
	}
	b.Logf("document %d bytes; publisher sent %d bytes/round", len(docs[0]), nc.Stats().OutBytes/uint64(b.N+1))
}

// cpuTime is the CPU this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingConnect connects with a dialer that counts the bytes read off
// the wire into n.
func countingConnect(b *testing.B, url string, n *atomic.Int64) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	nc, err := nats.Connect(url, nats.SetCustomDialer(countingDialer{n}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

type countingDialer struct{ n *atomic.Int64 }

func (d countingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return countingConn{c, d.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.Add(int64(k))
	return k, err
}
