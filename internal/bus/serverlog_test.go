package bus

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// TestServerLevels: nats-server lines that normal operation produces (a
// cluster forming, a peer away, an index rebuilt after an unclean stop)
// are info; damage stays a warning, failures errors.
func TestServerLevels(t *testing.T) {
	cases := []struct {
		msg  string
		def  zerolog.Level
		want zerolog.Level
	}{
		{"Error trying to connect to route (attempt 3): dial tcp 127.0.0.1:6223: connect: connection refused", zerolog.ErrorLevel, zerolog.InfoLevel},
		{"JetStream cluster detected stream remapping for '$G > KV_poolplanner-inventory' from \"S-R1F-a\" to \"S-R3F-b\"", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Waiting for routing to be established...", zerolog.WarnLevel, zerolog.InfoLevel},
		{"JetStream has not established contact with a meta leader", zerolog.WarnLevel, zerolog.InfoLevel},
		{"JetStream is not current with the meta leader", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Catchup for stream '%s > %s' resetting first sequence: %d on catchup request", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Filestore [KV_poolplanner-inventory] Recovering stream state from index errored: %v", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Filestore [_meta_] Stream state outdated, last block has additional entries, will rebuild", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Filestore [POOLPLANNER_PLANS] TTL state is outdated; attempting to recover using linear scan (seq %d to %d)", zerolog.WarnLevel, zerolog.InfoLevel},
		{"Filestore [POOLPLANNER_PLANS] Stream state checksum did not match", zerolog.WarnLevel, zerolog.WarnLevel},
		{"Filestore [POOLPLANNER_PLANS] indexCacheBuf corrupt state in %s: mb.first %d mb.last %d", zerolog.WarnLevel, zerolog.WarnLevel},
		{"Filestore [x Recovering stream state from index errored", zerolog.WarnLevel, zerolog.WarnLevel},
		{"JetStream cluster stream '%s > %s' has NO quorum, stalled", zerolog.WarnLevel, zerolog.WarnLevel},
		{"Error listening on port: %s, %q", zerolog.ErrorLevel, zerolog.ErrorLevel},
		{"127.0.0.1:36955 - rid:10 - Error flushing: writev tcp 127.0.0.1:55538->127.0.0.1:36955: writev: connection reset by peer", zerolog.ErrorLevel, zerolog.InfoLevel},
		{"127.0.0.1:36955 - rid:10 - Error flushing: write tcp 127.0.0.1:55538->127.0.0.1:36955: write: broken pipe", zerolog.ErrorLevel, zerolog.InfoLevel},
		{"127.0.0.1:36955 - cid:10 - Error flushing: writev tcp 127.0.0.1:55538->127.0.0.1:36955: writev: connection reset by peer", zerolog.ErrorLevel, zerolog.ErrorLevel},
		{"127.0.0.1:36955 - rid:10 - Router connection closed: Parse Error", zerolog.ErrorLevel, zerolog.ErrorLevel},
	}
	for _, c := range cases {
		if got := serverLevel(c.msg, c.def); got != c.want {
			t.Errorf("serverLevel(%q, %s) = %s, want %s", c.msg, c.def, got, c.want)
		}
	}
}

// levels counts the log lines at each level (a zerolog hook).
type levels struct {
	mu sync.Mutex
	n  map[zerolog.Level]int
}

func (l *levels) Run(_ *zerolog.Event, level zerolog.Level, _ string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[level]++
}

func (l *levels) count(level zerolog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[level]
}

// TestCrashRecoveryQuiet: a server started on a store as a kill -9
// leaves it (its files copied while it ran: indexes older than the
// message blocks) recovers every message and logs no warning or error
// doing so.
func TestCrashRecoveryQuiet(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live")
	ns, url, err := StartEmbedded(EmbeddedOptions{StoreDir: live})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "crash", TTL: time.Hour, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 50
	for i := range keys {
		if _, err := kv.Put(ctx, "k"+string(rune('a'+i%26))+string(rune('a'+i/26)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// The files as they are now, while the server runs: what kill -9
	// leaves (the server writes its indexes at a clean stop).
	crashed := filepath.Join(dir, "crashed")
	if err := os.CopyFS(crashed, os.DirFS(live)); err != nil {
		t.Fatal(err)
	}
	seen := &levels{n: map[zerolog.Level]int{}}
	log := zerolog.New(nil).Hook(seen)
	ns2, url2, err := StartEmbedded(EmbeddedOptions{StoreDir: crashed, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns2.Shutdown(); ns2.WaitForShutdown() }()
	nc2, err := nats.Connect(url2)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	st, err := js2.Stream(ctx, "KV_crash")
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got != keys {
		t.Fatalf("recovered %d messages, want %d", got, keys)
	}
	if seen.count(zerolog.InfoLevel) == 0 {
		t.Error("no info line: the recovery was not seen, the test proves nothing")
	}
	if w, e := seen.count(zerolog.WarnLevel), seen.count(zerolog.ErrorLevel); w+e > 0 {
		t.Errorf("recovering from an unclean stop logged %d warnings and %d errors", w, e)
	}
}
