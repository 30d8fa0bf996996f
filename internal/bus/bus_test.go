package bus

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/natstest"
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
	srv := natstest.Start(t)
	url, port := srv.URL(), srv.Addr()
	srv.Stop()

	nc, err := Connect(url, "test", zerolog.Nop(), Security{})
	if err != nil {
		t.Fatalf("Connect with the server down: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to a server that is down")
	}
	srv.Start()
	natstest.WaitFor(t, 10*time.Second, "connected once the server came up", nc.IsConnected)
	if !strings.Contains(nc.ConnectedUrl(), port) {
		t.Errorf("connected to %s", nc.ConnectedUrl())
	}
}
