package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestRestartKeepsStore: a stream made before Stop is there after Start,
// on the same URL, through the same connection.
func TestRestartKeepsStore(t *testing.T) {
	s := Start(t)
	js := s.JS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t", []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop() // a no-op
	s.Start()
	WaitFor(t, 30*time.Second, "the stream back with its message", func() bool {
		// Each try is bounded: a request sent as the connection notices
		// the server went away is lost, and is tried again, not waited on.
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := js.Stream(ctx, "T")
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
}

// TestWaitEvery: the condition is checked every poll, until it holds.
func TestWaitEvery(t *testing.T) {
	calls := 0
	start := time.Now()
	WaitEvery(t, 30*time.Second, 20*time.Millisecond, "the third call", func() bool { calls++; return calls == 3 })
	if took := time.Since(start); calls != 3 || took < 40*time.Millisecond {
		t.Fatalf("%d calls in %s", calls, took)
	}
}

// TestWaitForFails: a condition that never holds fails the test.
func TestWaitForFails(t *testing.T) {
	ft := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(ft, 30*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if ft.msg != "not never within 30ms" {
		t.Fatalf("failed with %q", ft.msg)
	}
}

type fakeTB struct {
	testing.TB
	msg string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestWipe: after Wipe the server is back on its URL without the stream.
func TestWipe(t *testing.T) {
	s := Start(t)
	js := s.JS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	s.Wipe()
	WaitFor(t, 30*time.Second, "the stream gone", func() bool {
		_, err := js.Stream(ctx, "T")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
	if s.URL() != "nats://"+s.Addr() {
		t.Fatalf("URL %s, Addr %s", s.URL(), s.Addr())
	}
}

// TestPort: a server on a port chosen before it starts, as a client
// given that address waits for it.
func TestPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := Start(t, Port(port))
	if want := fmt.Sprintf("127.0.0.1:%d", port); s.Addr() != want {
		t.Fatalf("addr %s, want %s", s.Addr(), want)
	}
	if !s.Conn(t).IsConnected() {
		t.Fatal("not connected")
	}
}

// TestMaxPayload: the option reaches the server, and stays after a
// restart.
func TestMaxPayload(t *testing.T) {
	s := Start(t, MaxPayload(1024))
	s.Stop()
	s.Start()
	if got := s.Conn(t).MaxPayload(); got != 1024 {
		t.Fatalf("max payload %d, want 1024", got)
	}
}
