// Package natstest starts embedded NATS servers for tests and waits on
// conditions: one place for what every package's tests repeated.
//
// It depends on the NATS server and client only, so that any package's
// tests (internal/bus's among them) may use it.
package natstest

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is an embedded NATS server with JetStream, its store in a
// test's temp dir. Stop and Start restart it on the same port and store
// (a server that goes away and comes back).
type Server struct {
	tb   testing.TB
	dir  string
	port int
	opts []Option
	ns   *server.Server
}

// An Option changes the server's options (a limit, say) before each
// start; the host, port and store are the Server's own.
type Option func(*server.Options)

// MaxPayload makes the server refuse messages over n bytes (NATS's
// default is 1 MB), for tests of what goes over a limit.
func MaxPayload(n int32) Option {
	return func(o *server.Options) { o.MaxPayload = n }
}

// Port makes the server listen on port (of 127.0.0.1) rather than a
// free one: for a test that has a client wait on an address before any
// server is there.
func Port(port int) Option {
	return func(o *server.Options) { o.Port = port }
}

// Start starts a server on a free port (or Port's), stopped when the
// test ends.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	first := &server.Options{Port: -1}
	for _, o := range opts {
		o(first)
	}
	s := &Server{tb: tb, dir: tb.TempDir(), port: first.Port, opts: opts}
	s.Start()
	s.port = s.ns.Addr().(*net.TCPAddr).Port
	tb.Cleanup(s.Stop)
	return s
}

// Start (re)starts a stopped server on its port and store.
func (s *Server) Start() {
	s.tb.Helper()
	if s.ns != nil {
		return
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: s.port, JetStream: true, StoreDir: s.dir,
		NoLog: true, NoSigs: true,
	}
	for _, o := range s.opts {
		o(opts)
	}
	opts.Host, opts.Port, opts.StoreDir = "127.0.0.1", s.port, s.dir
	ns, err := server.NewServer(opts)
	if err != nil {
		s.tb.Fatalf("natstest: new server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		s.tb.Fatalf("natstest: server on port %d not ready within 30s", s.port)
	}
	s.ns = ns
}

// Stop shuts the server down and waits until it is gone; a stopped
// server stops again as a no-op.
func (s *Server) Stop() {
	if s.ns == nil {
		return
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.ns = nil
}

// Wipe restarts the server on its port with an empty store: a server
// that lost its data.
func (s *Server) Wipe() {
	s.tb.Helper()
	s.Stop()
	if err := os.RemoveAll(s.dir); err != nil {
		s.tb.Fatalf("natstest: wipe %s: %v", s.dir, err)
	}
	s.Start()
}

// Addr is the server's HOST:PORT.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL is the server's client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// NATS is the running server (nil while stopped).
func (s *Server) NATS() *server.Server { return s.ns }

// Conn connects to the server, closed when the test ends. It reconnects
// for ever, so that it rides out a Stop and Start.
func (s *Server) Conn(tb testing.TB) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatalf("natstest: connect %s: %v", s.URL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// JS connects to the server and returns JetStream on that connection.
func (s *Server) JS(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(s.Conn(tb))
	if err != nil {
		tb.Fatalf("natstest: jetstream: %v", err)
	}
	return js
}

// Poll is how often WaitFor checks its condition.
const Poll = 10 * time.Millisecond

// WaitFor waits until cond holds, checking every Poll, and fails the
// test, naming what it waited for, when within passes first.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	WaitEvery(tb, within, Poll, what, cond)
}

// WaitEvery is WaitFor checking every poll: for a condition that costs
// (a command run, a connection made each time).
func WaitEvery(tb testing.TB, within, poll time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not %s within %s", what, within)
		}
		time.Sleep(poll)
	}
}
