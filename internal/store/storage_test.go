package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// TestEnsureFitsStorage: the replies bucket asks what the server has room
// for, down to RepliesMinBytes; below that the refusal says storage, not
// servers.
func TestEnsureFitsStorage(t *testing.T) {
	for _, c := range []struct {
		name     string
		maxStore int64
		want     int64
		err      string
	}{
		{"plenty", 4 << 30, bus.RepliesMaxBytes, ""},
		{"one GiB", 1 << 30, bus.RepliesMaxBytes, ""},
		{"300 MiB", 300 << 20, 256 << 20, ""},
		{"8 MiB", 8 << 20, 0, "insufficient storage: it asked 16 MiB reserved on each of 1 servers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir(), MaxFileStore: c.maxStore})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
			_, js := connect(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			store := NewPlanStore(js)
			err = store.Ensure(ctx)
			if c.err != "" {
				if !errors.Is(err, bus.ErrStorage) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Ensure: %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || store.RepliesBytes != c.want {
				t.Fatalf("Ensure: %v, replies bucket %d bytes, want %d", err, store.RepliesBytes, c.want)
			}
			// Ensured again (a restart), the bucket keeps its size: the
			// server checks a create of it, even one changing nothing, as
			// if its bytes were not reserved yet.
			again := NewPlanStore(js)
			if err := again.Ensure(ctx); err != nil || again.RepliesBytes != c.want {
				t.Fatalf("Ensure again: %v, replies bucket %d bytes, want %d", err, again.RepliesBytes, c.want)
			}
			st, err := js.Stream(ctx, "OBJ_"+client.RepliesBucket)
			if err != nil || st.CachedInfo().Config.MaxBytes != c.want {
				t.Fatalf("replies bucket after Ensure again: %v, %d bytes, want %d", err, st.CachedInfo().Config.MaxBytes, c.want)
			}
		})
	}
}
