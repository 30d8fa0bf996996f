package gpumap

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// serveLimited serves a map of four nodes with lim on a free port.
func serveLimited(t *testing.T, lim Limits) string {
	t.Helper()
	docs, p := cluster(t, 4)
	s := NewServer(fixedSource{[]*planner.Plan{p}, docs}, zerolog.Nop())
	s.Limits = lim
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Serve(ctx, l, natstest.Start(t).Conn(t)); err != nil {
		t.Fatal(err)
	}
	return l.Addr().String()
}

// closedByServer says whether the server closes c within d: a read
// that ends (EOF, reset) rather than timing out.
func closedByServer(t *testing.T, c net.Conn, r io.Reader, d time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestIdleConnectionsClosed: a keep-alive connection left idle after a
// request, and one that never sends a whole request, are closed by the
// map, not kept for ever.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, Limits{MaxConns: 8, ReadHeader: 300 * time.Millisecond, Read: 300 * time.Millisecond,
		Idle: 300 * time.Millisecond, Write: time.Second})
	for _, c := range []struct {
		name string
		send string
	}{
		{"idle keep-alive", "GET /api/map HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"half a header", "GET /api/map HTTP/1.1\r\nHost: x\r\n"},
		{"nothing", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(conn)
			if c.name == "idle keep-alive" {
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Close {
					t.Fatalf("status %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
				}
			}
			if !closedByServer(t, conn, r, 10*time.Second) {
				t.Fatal("the connection is still open after 10s")
			}
		})
	}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// TestConnectionCap: connections beyond the cap wait in the backlog,
// holding no descriptor of the process: of 20 connections each sending
// a request, the cap's are answered and the rest wait, costing the
// test's own 20 descriptors and at most the cap's on the map's side;
// as answered ones close, the waiting ones are answered in turn.
func TestConnectionCap(t *testing.T) {
	const maxConns, dialed = 4, 20
	addr := serveLimited(t, Limits{MaxConns: maxConns, ReadHeader: time.Minute, Read: time.Minute, Idle: time.Minute, Write: time.Minute})
	before := openFDs(t)
	readers := make([]*bufio.Reader, dialed)
	conns := make([]net.Conn, dialed)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /api/map HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conns[i], readers[i] = c, bufio.NewReader(c)
	}
	// answered reads the responses the open connections get within a
	// second, all at once; results[i] is written by i's goroutine alone.
	answered := func(open []int) []int {
		results := make([]bool, len(open))
		var wg sync.WaitGroup
		for k, i := range open {
			wg.Go(func() {
				_ = conns[i].SetReadDeadline(time.Now().Add(time.Second))
				resp, err := http.ReadResponse(readers[i], nil)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				results[k] = err == nil
			})
		}
		wg.Wait()
		var got []int
		for k, ok := range results {
			if ok {
				got = append(got, open[k])
			}
		}
		return got
	}
	open := make([]int, dialed)
	for i := range open {
		open[i] = i
	}
	got := answered(open)
	if len(got) != maxConns {
		t.Fatalf("%d of %d connections answered, want the cap's %d", len(got), dialed, maxConns)
	}
	if n := openFDs(t) - before; n > dialed+maxConns+2 {
		t.Errorf("%d descriptors for %d connections, want at most %d (the cap's %d on the map's side)", n, dialed, dialed+maxConns+2, maxConns)
	}
	// The rest were waiting, not refused: close the answered ones and
	// the others are answered in turn.
	for served := len(got); served < dialed; {
		for _, i := range got {
			conns[i].Close()
			open = slices.DeleteFunc(open, func(j int) bool { return j == i })
		}
		if got = answered(open); len(got) == 0 {
			t.Fatalf("%d connections still waiting, none answered", len(open))
		}
		served += len(got)
	}
}
