package bus

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestWatchDropped: requests an embedded server's JetStream API queue
// overflows with are counted, with auth and without; a server that
// drops none counts none.
func TestWatchDropped(t *testing.T) {
	for _, c := range []struct {
		name   string
		secure bool
		limit  int64 // the server's queue limit
		burst  int   // requests sent at once
		drops  bool
	}{
		{"open, overflowed", false, 8, 2000, true},
		{"auth, overflowed", true, 8, 2000, true},
		{"open, within the limit", false, 0, 200, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := EmbeddedOptions{StoreDir: dir, RequestQueueLimit: c.limit}
			account, sec := OpenAccount, Security{}
			if c.secure {
				a, err := auth.Open(filepath.Join(dir, "auth"))
				if err != nil {
					t.Fatal(err)
				}
				data, err := a.Creds(auth.Planner, "", 0)
				if err != nil {
					t.Fatal(err)
				}
				sec.Creds = filepath.Join(dir, "planner.creds")
				if err := os.WriteFile(sec.Creds, data, 0o600); err != nil {
					t.Fatal(err)
				}
				opts.Auth, account = a, a.AccountKey
			}
			ns, url, err := StartEmbedded(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
			nc, err := Connect(url, "test", zerolog.Nop(), sec, nats.InProcessServer(ns))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			var dropped atomic.Int64
			sub, err := WatchDropped(ns, account, nc, func(n int64) { dropped.Add(n) })
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			// Every request is answered or dropped: count the answers.
			var answered atomic.Int64
			inbox := nc.NewRespInbox()
			replies, err := nc.Subscribe(inbox, func(*nats.Msg) { answered.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer replies.Unsubscribe()
			for range c.burst {
				if err := nc.PublishRequest("$JS.API.INFO", inbox, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			natstest.WaitFor(t, 30*time.Second, "every request answered or counted dropped", func() bool {
				return answered.Load()+dropped.Load() == int64(c.burst)
			})
			if got := dropped.Load() > 0; got != c.drops {
				t.Fatalf("dropped %d of %d (answered %d); want drops: %v", dropped.Load(), c.burst, answered.Load(), c.drops)
			}
		})
	}
}
