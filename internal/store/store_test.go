package store

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// startServer starts an embedded server on a free port with JetStream in
// a temp dir (natstest's), stopped when the test ends.
func startServer(t testing.TB) (*server.Server, string) {
	t.Helper()
	s := natstest.Start(t)
	return s.NATS(), s.URL()
}

func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := bus.Connect(url, "test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func testDoc(t testing.TB, nodeID string) []byte {
	t.Helper()
	sim, _ := inventory.ParseSimulation("8xH100")
	inv, _ := inventory.NewSimulated(inventory.Facts{NodeID: nodeID, IP: "10.0.0.1", CPUs: 64}, sim).Inventory(context.Background())
	inv.ReportedAt = time.Now().UTC()
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The bucket gets the same settings whoever creates it, and a second
// create-or-update is a no-op; a bucket made by an earlier version (as
// nats.go makes KV buckets, rollups allowed) is brought to them.
func TestBucketSettings(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: client.InventoryBucket, History: bus.InventoryHistory,
		Storage: jetstream.FileStorage, LimitMarkerTTL: bus.MinKeyTTL}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := NewInventoryStore(js).Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, bus.InventoryStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != bus.InventoryHistory || !cfg.AllowMsgTTL || cfg.SubjectDeleteMarkerTTL != 0 || cfg.MaxAge != 0 || cfg.Storage != jetstream.FileStorage ||
		cfg.AllowRollup || !cfg.DenyPurge || cfg.MaxMsgSize != bus.InventoryMaxDoc {
		t.Errorf("stream config = %+v", cfg)
	}
}

func TestPutGetDeleteList(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	s := NewInventoryStore(js)
	doc := testDoc(t, "n1")
	rev, err := s.Put(ctx, "n1", doc, false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := s.Put(ctx, "n1", doc, true, time.Minute)
	if err != nil || hb <= rev {
		t.Fatalf("heartbeat put: rev %d, %v", hb, err)
	}
	if _, err := s.Put(ctx, "n2", testDoc(t, "n2"), false, time.Minute); err != nil {
		t.Fatal(err)
	}
	inv, got, err := s.Get(ctx, "n1")
	if err != nil || got != hb || inv.NodeID != "n1" || len(inv.GPUs) != 8 {
		t.Fatalf("Get = %s rev %d, %v", inv.NodeID, got, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %d nodes, %v", len(list), err)
	}
	if err := s.Delete(ctx, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("Get after delete: %v, want ErrKeyNotFound", err)
	}
	if _, err := s.Put(ctx, "bad key", doc, false, time.Minute); !errors.Is(err, inventory.ErrInvalidNodeID) {
		t.Errorf("Put with a bad key: %v", err)
	}
}

// TestExpiryReachesWatchers: a key whose TTL runs out is gone from the
// bucket and the watch delivers Removed/expired for it, although the
// bucket (refusing rollups) leaves no marker.
func TestExpiryReachesWatchers(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	kv, err := s.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Op != Synced {
		t.Fatalf("first event %v, want synced", ev.Op)
	}
	start := time.Now()
	if _, err := s.Put(ctx, "n1", testDoc(t, "n1"), false, time.Second); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op     EventOp
		reason string
	}{{Changed, ""}, {Removed, ReasonExpired}}
	for _, w := range want {
		select {
		case ev := <-events:
			if ev.Op != w.op || ev.NodeID != "n1" || ev.Reason != w.reason {
				t.Fatalf("event %+v, want %v %q", ev, w.op, w.reason)
			}
			if ev.Op == Changed && (ev.Inventory.NodeID != "n1" || ev.ExpiresAt.IsZero()) {
				t.Errorf("changed event inventory %q expires %v", ev.Inventory.NodeID, ev.ExpiresAt)
			}
		case <-ctx.Done():
			t.Fatalf("Watch: no %v event", w.op)
		}
	}
	t.Logf("expiry seen %s after a put with a 1s TTL", time.Since(start).Round(time.Millisecond))
	if _, err := kv.Get(ctx, "n1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the expired key is still there: %v", err)
	}
}

// Watch reads heartbeats as headers only: it reports them as Heartbeat,
// and an orderly delete as Removed/deleted.
func TestWatchHeartbeatsAndDelete(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	doc := testDoc(t, "n1")
	// A key that exists before the watch starts, last written by a
	// heartbeat: the watcher has no value yet, so it reads it.
	s.Put(ctx, "n1", doc, false, time.Minute)
	s.Put(ctx, "n1", doc, true, time.Minute)
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(ctx, "n1", doc, true, time.Minute)
	s.Delete(ctx, "n1", time.Minute)
	want := []struct {
		op     EventOp
		reason string
	}{{Changed, ""}, {Synced, ""}, {Heartbeat, ""}, {Removed, ReasonDeleted}}
	for _, w := range want {
		select {
		case ev := <-events:
			if ev.Op != w.op || ev.Reason != w.reason {
				t.Fatalf("event %+v, want %v %q", ev, w.op, w.reason)
			}
		case <-ctx.Done():
			t.Fatalf("no %v event", w.op)
		}
	}
	cancel()
	for range events {
	}
}

// A bucket that disappears (a server restarted without its storage) is
// made again by the next put.
func TestPutRecreatesBucket(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	s := NewInventoryStore(js)
	if _, err := s.Put(ctx, "n1", testDoc(t, "n1"), false, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, client.InventoryBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "n1", testDoc(t, "n1"), true, time.Minute); err != nil {
		t.Fatalf("put after bucket loss: %v", err)
	}
	if _, _, err := s.Get(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotsOfOneRevision: two planners racing to publish a revision
// each store their own snapshot; neither overwrites the other's, and the
// loser's can be dropped. The retention's parse of snapshot names reads
// their revision.
func TestSnapshotsOfOneRevision(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	s := NewPlanStore(js)
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	a := &plan.Document{Header: plan.Header{Name: "default", Revision: 7, Reason: "a"}}
	b := &plan.Document{Header: plan.Header{Name: "default", Revision: 7, Reason: "b"}}
	na, _, err := s.PutSnapshot(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	nb, _, err := s.PutSnapshot(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if na == nb {
		t.Fatalf("both snapshots of revision 7 are %s", na)
	}
	obs, _ := js.ObjectStore(ctx, client.PlansBucket)
	z, err := obs.GetBytes(ctx, na)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := wire.Gunzip(z, 1<<20)
	if !strings.Contains(string(raw), `"reason":"a"`) {
		t.Fatalf("snapshot %s holds %s", na, raw)
	}
	s.DropSnapshot(ctx, nb)
	if _, err := obs.GetBytes(ctx, nb); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("dropped snapshot %s: %v", nb, err)
	}
	for name, want := range map[string]int{na: 7, "default/snapshots/12/x": 12, "other/snapshots/3/x": -1, "default/assignments/n1": -1} {
		rev, ok := wire.SnapshotRevision("default", name)
		if want < 0 && ok || want >= 0 && rev != want {
			t.Errorf("SnapshotRevision(%s) = %d %v, want %d", name, rev, ok, want)
		}
	}
}

// TestAssignmentObjects: assignments too large for a message (on a
// server taking 64 KiB) go into objects. Node ids may hold "/": node x's
// objects are never taken for node x/y's. When a node's new message is
// stored its old object goes; a message whose object is gone is
// unreadable, not "no assignment".
func TestAssignmentObjects(t *testing.T) {
	_, js := connect(t, natstest.Start(t, natstest.MaxPayload(64<<10)).URL())
	ctx := context.Background()
	s := NewPlanStore(js)
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	big := func(node string, rev, n int) client.Assignment {
		a := client.Assignment{Plan: "default", Revision: rev, NodeID: node}
		for i := range n {
			w := plan.Worker{Component: plan.Env, Index: i, NodeID: node, GPUs: []int{0}, GPUUUIDs: []string{rand.Text()}, GPUShare: 0.001}
			a.Workers = append(a.Workers, client.PlacedWorker{Worker: w, Plan: "default", Revision: rev, CUDAVisibleDevices: wire.VisibleDevices(w)})
		}
		return a
	}
	if _, err := s.PublishAssignments(ctx, []client.Assignment{big("x/y", 1, 3000)}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PublishAssignments(ctx, []client.Assignment{big("x", 1, 3000), big("x", 2, 3000)}, false); err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(js.Conn())
	for node, rev := range map[string]int{"x/y": 1, "x": 2} {
		if a, err := c.Assignment(ctx, "default", node); err != nil || a.Revision != rev || len(a.Workers) != 3000 {
			t.Fatalf("node %s: %v", node, err)
		}
	}
	obs, _ := js.ObjectStore(ctx, client.PlansBucket)
	objs, _ := obs.List(ctx)
	count := map[string]int{}
	for _, o := range objs {
		for _, node := range []string{"x", "x/y"} {
			if strings.HasPrefix(o.Name, wire.AssignmentObjectPrefix("default", node)) {
				count[node]++
			}
		}
	}
	if count["x"] != 1 || count["x/y"] != 1 {
		t.Fatalf("objects per node %v, want one each", count)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, wire.AssignmentObjectPrefix("default", "x/y")) {
			_ = obs.Delete(ctx, o.Name)
		}
	}
	if _, err := c.Assignment(ctx, "default", "x/y"); !errors.Is(err, client.ErrUnreadable) {
		t.Errorf("a message whose object is gone: %v, want unreadable", err)
	}
}

// TestWatchRejects: a document the watcher cannot trust (not JSON,
// another node's id, impossible values) is one Rejected event of its
// kind, and its heartbeats nothing; the next valid document is a change
// again.
func TestWatchRejects(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewInventoryStore(js)
	doc := testDoc(t, "n1")
	s.Put(ctx, "n1", doc, false, time.Minute)
	events, err := s.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte("{not json")
	s.Put(ctx, "n1", bad, false, time.Minute)
	s.Put(ctx, "n1", bad, true, time.Minute)
	s.Put(ctx, "n1", testDoc(t, "n2"), false, time.Minute)
	s.Put(ctx, "n1", []byte(`{"node_id": ""}`), false, time.Minute)
	s.Put(ctx, "n1", doc, false, time.Minute)
	var got, kinds []string
	for len(got) < 6 {
		select {
		case ev := <-events:
			got = append(got, ev.Op.String()+" "+ev.Reason)
			if ev.Op == Rejected {
				kinds = append(kinds, ev.Rejection.String())
			}
		case <-ctx.Done():
			t.Fatalf("events %q", got)
		}
	}
	if got[0] != "changed " || got[1] != "synced " || !strings.HasPrefix(got[2], "rejected invalid character") ||
		got[3] != `rejected node_id: "n2" under key "n1"; a document must be the key's node` ||
		got[4] != "rejected node_id: missing" || got[5] != "changed " {
		t.Fatalf("events %q", got)
	}
	if fmt.Sprint(kinds) != "[unparsable key_mismatch invalid]" {
		t.Errorf("rejections' kinds %v", kinds)
	}
}

// TestReleaseLease: giving the lease back after renewals frees it at
// once, the earlier renewals with it; someone else's is left alone.
func TestReleaseLease(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx := context.Background()
	s := NewPlanStore(js)
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	l := &bus.Lease{Holder: "a", TTLSeconds: 60}
	seq, err := s.WriteLease(ctx, "default", l, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteLease(ctx, "default", &bus.Lease{Holder: "b", TTLSeconds: 60}, 0); !errors.Is(err, bus.ErrLeaseHeld) {
		t.Fatalf("a second holder: %v", err)
	}
	if seq, err = s.WriteLease(ctx, "default", l, seq); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseLease(ctx, "default", seq-1); err != nil { // not the current one
		t.Fatal(err)
	}
	if cur, err := s.ReadLease(ctx, "default"); err != nil || cur == nil || cur.Seq != seq {
		t.Fatalf("a stale release freed the lease: %+v %v", cur, err)
	}
	if err := s.ReleaseLease(ctx, "default", seq); err != nil {
		t.Fatal(err)
	}
	if cur, err := s.ReadLease(ctx, "default"); err != nil || cur != nil {
		t.Fatalf("after release: %+v %v", cur, err)
	}
	if _, err := s.WriteLease(ctx, "default", &bus.Lease{Holder: "b", TTLSeconds: 60}, 0); err != nil {
		t.Fatalf("taking the released lease: %v", err)
	}
}

// TestRevisionMeta: a revision read back (latest, by number, followed)
// carries what its publish said in the one metadata type: its event's
// sequence, its base, its spec's digest and its publisher.
func TestRevisionMeta(t *testing.T) {
	_, url := startServer(t)
	_, js := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := NewPlanStore(js)
	s.Publisher = "planner-a"
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for rev, digest := range []string{"d1", "d2"} {
		doc := plan.Document{Header: plan.Header{Name: "default", Revision: rev + 1, Status: plan.Status{State: plan.StateValid}}}
		ev := &plan.Event{Header: doc.Header, Base: rev + 1, Placement: &doc.Placement}
		var expect uint64
		if len(seqs) > 0 {
			expect = seqs[len(seqs)-1]
		}
		// The second says its spec's revision; the first, as from before
		// planners did, not.
		seq, err := s.PublishEventFor(ctx, ev, Digests{Spec: digest, SpecRevision: uint64(rev) * 5}, expect, 0)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	want := client.Meta{Seq: seqs[1], Base: 2, SpecDigest: "d2", SpecRevision: 5, Publisher: "planner-a"}
	latest, err := s.Latest(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Revision(ctx, "default", 1)
	if err != nil {
		t.Fatal(err)
	}
	follow, err := s.Follow(ctx, "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	followed := <-follow
	for _, c := range []struct {
		name string
		got  *StoredPlan
		want client.Meta
	}{
		{"latest", latest, want},
		{"revision 1", first, client.Meta{Seq: seqs[0], Base: 1, SpecDigest: "d1", Publisher: "planner-a"}},
		{"followed", followed, want},
	} {
		if c.got == nil || c.got.Meta != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, c.got, c.want)
		}
	}
	var infos []client.Meta
	if err := s.Client().History(ctx, "default", func(i client.Info) bool { infos = append(infos, i.Meta); return true }); err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[1] != want || infos[0].SpecDigest != "d1" {
		t.Errorf("history metadata %+v, want the two revisions' (the last %+v)", infos, want)
	}
}
