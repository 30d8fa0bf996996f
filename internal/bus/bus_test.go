package bus

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestKeyTTL(t *testing.T) {
	tests := []struct{ in, want time.Duration }{
		{0, time.Second},
		{200 * time.Millisecond, time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
		{15 * time.Second, 15 * time.Second},
	}
	for _, tt := range tests {
		if got := KeyTTL(tt.in); got != tt.want {
			t.Errorf("KeyTTL(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	for attempt, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		got := Backoff(attempt)
		if got < want*8/10 || got > want*12/10 {
			t.Errorf("Backoff(%d) = %s, want %s ±20%%", attempt, got, want)
		}
	}
	for _, attempt := range []int{10, 100, 1 << 20} {
		_ = Backoff(-attempt) // never panics
		if got := Backoff(attempt); got > BackoffMax*12/10 || got < BackoffMax*8/10 {
			t.Errorf("Backoff(%d) = %s, want about %s", attempt, got, BackoffMax)
		}
	}
}

func TestStartEmbeddedErrors(t *testing.T) {
	tests := []EmbeddedOptions{
		{},
		{StoreDir: t.TempDir(), Listen: "nonsense"},
		{StoreDir: t.TempDir(), Listen: "127.0.0.1:http"},
	}
	for _, opts := range tests {
		if _, _, err := StartEmbedded(opts); err == nil {
			t.Errorf("StartEmbedded(%+v): no error", opts)
		}
	}
}

func TestConnectServerDownAtStart(t *testing.T) {
	// A free port nobody listens on yet.
	ns, url, err := StartEmbedded(EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	port := ns.Addr().String()
	ns.Shutdown()
	ns.WaitForShutdown()

	nc, err := Connect(url, "test", zerolog.Nop(), Security{})
	if err != nil {
		t.Fatalf("Connect with the server down: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to a server that is down")
	}
	ns2, _, err := StartEmbedded(EmbeddedOptions{Listen: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns2.Shutdown(); ns2.WaitForShutdown() }()
	deadline := time.Now().Add(10 * time.Second)
	for !nc.IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("did not connect once the server came up")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(nc.ConnectedUrl(), port) {
		t.Errorf("connected to %s", nc.ConnectedUrl())
	}
}
