package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// longTests names the environment variable that runs the scale tests,
// a minute or two of CPU each: .ci/run sets it, so that CI runs them; a
// developer's go test of the package does not.
const longTests = "POOLPLANNER_LONG_TESTS"

// long skips a scale test unless longTests is set (and in -short).
func long(t *testing.T, what string) {
	t.Helper()
	if testing.Short() || os.Getenv(longTests) == "" {
		t.Skipf("%s: a long test; set %s=1 (and no -short) to run it, as .ci/run does", what, longTests)
	}
}

// scaleSpec fills fifteen sixteenths of n 8-GPU nodes: a quarter of the
// GPUs to train, a quarter to eval (4 GPUs a worker), the rest to env at
// 0.25: about 18 workers a node.
func scaleSpec(n int) string {
	gpus := 8 * (n - n/16)
	return fmt.Sprintf(`
scheduling:
  train:  {worker_num: %d, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: %d, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: %d, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`, gpus/4, gpus/16, gpus/2*4)
}

// scaleNode is the id of simulated node i of a scale test.
func scaleNode(i int) string { return fmt.Sprintf("node-%06d", i) }

// fillBucket puts n simulated nodes straight into the inventory bucket,
// as n reporters would, keys living an hour.
func fillBucket(tb testing.TB, js jetstream.JetStream, n int) {
	tb.Helper()
	ctx := context.Background()
	if _, err := store.NewInventoryStore(js).Ensure(ctx); err != nil {
		tb.Fatal(err)
	}
	acks := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		id := scaleNode(i)
		msg := &nats.Msg{Subject: bus.InventorySubject(id), Data: simDoc(id)}
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgTTL(bus.KeyTTL(time.Hour)))
		if err != nil {
			tb.Fatal(err)
		}
		acks = append(acks, f)
		if len(acks) >= 512 {
			waitAcks(tb, acks[:1])
			acks = acks[1:]
		}
	}
	waitAcks(tb, acks)
}

func waitAcks(tb testing.TB, acks []jetstream.PubAckFuture) {
	tb.Helper()
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			tb.Fatal(err)
		case <-time.After(30 * time.Second):
			tb.Fatal("no ack")
		}
	}
}

// largest is the size of the largest message (subject, headers and
// body) a server carries while it watches.
type largest struct{ n, synced atomic.Int64 }

// sync waits until the watcher has seen every message nc published so
// far: a server delivers one connection's messages in order, so a marker
// published last arrives last.
func (l *largest) sync(tb testing.TB, nc *nats.Conn) {
	tb.Helper()
	n := l.synced.Load() + 1
	if err := nc.Publish(fmt.Sprintf("%s.%d", syncSubject, n), nil); err != nil {
		tb.Fatal(err)
	}
	natstest.WaitFor(tb, 10*time.Second, "the largest message watcher caught up", func() bool { return l.synced.Load() >= n })
}

// syncSubject is the prefix of largest.sync's markers.
const syncSubject = "poolplanner-test.sync"

// watchLargest subscribes to every subject on its own connection.
func watchLargest(tb testing.TB, url string) *largest {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	l := &largest{}
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		if seq, ok := strings.CutPrefix(m.Subject, syncSubject+"."); ok {
			if n, err := strconv.ParseInt(seq, 10, 64); err == nil {
				l.synced.Store(n)
			}
			return
		}
		n := len(m.Subject) + len(m.Data)
		for k, vs := range m.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4
			}
		}
		if int64(n) > l.n.Load() {
			l.n.Store(int64(n))
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = nc.Flush()
	return l
}

// published is what a connection has published so far: messages and
// bytes (headers and bodies).
func published(nc *nats.Conn) (msgs, bytes uint64) {
	st := nc.Stats()
	return st.OutMsgs, st.OutBytes
}

// TestScaleNodeLeaves is the end-to-end test on NATS's default limits
// (1 MB messages): 20,000 nodes put straight into the bucket, the first
// revision is valid and no other comes before it, every node's
// assignment subject holds its workers and every worker of the spec is
// on exactly one; when one node leaves, its subject gets an empty list,
// the nodes that take its workers get theirs, and no other assignment
// subject is published on.
func TestScaleNodeLeaves(t *testing.T) {
	long(t, "20,000 nodes")
	const n = 20000
	s := startScale(t, n)
	c, ctx := s.c, context.Background()
	first := waitPlan(t, c, 1, 2*time.Minute)
	if !first.Document.Valid() {
		t.Fatalf("revision 1 invalid: %s", first.Document.Error)
	}
	checkEveryWorkerOnce(t, c, first.Document)
	checkAssignments(t, c, &planner.Plan{Document: *first.Document})
	msgs, bytes := published(s.planner)
	t.Logf("revision 1: a %s event; the planner published %d messages, %d bytes", first.Event.Kind(), msgs, bytes)

	// A node with workers leaves.
	before := byNode(first.Document)
	victim := first.Document.Workers.At(0).NodeID
	st, err := s.js.Stream(ctx, client.AssignmentsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(ctx)
	since := info.State.LastSeq
	msgs, bytes = published(s.planner)
	if err := store.NewInventoryStore(s.js).Delete(ctx, victim, time.Minute); err != nil {
		t.Fatal(err)
	}
	second := waitPlan(t, c, 2, time.Minute)
	if !second.Document.Valid() || second.Event.Kind() != "change" {
		t.Fatalf("revision 2: valid %v, %s event: %s", second.Document.Valid(), second.Event.Kind(), second.Document.Error)
	}
	// Each node whose workers differ between the revisions gets its new
	// list; no other node's subject is published on.
	want := map[string][]plan.Worker{victim: nil}
	after := byNode(second.Document)
	for node, is := range after {
		if !slices.EqualFunc(before[node], is, planner.SameWorker) {
			want[node] = is
		}
	}
	if len(after[victim]) != 0 {
		t.Fatalf("revision 2 still has workers on %s, which left", victim)
	}
	// The replan that published revision 2 sent its assignments before
	// it was done: all of them are stored by then.
	s.waitPublished(t, 2)
	got := assignmentsSince(t, st, since, len(want))
	if len(got) != len(want) {
		t.Errorf("%d assignment messages for revision 2, want %d (one per node whose workers changed)", len(got), len(want))
	}
	for node, ws := range want {
		a, ok := got[node]
		if !ok {
			t.Errorf("node %s: no assignment published", node)
			continue
		}
		have := make([]plan.Worker, len(a.Workers))
		for i, pw := range a.Workers {
			have[i] = pw.Worker
		}
		sortWorkers(have)
		if a.Revision != 2 || !slices.EqualFunc(have, ws, planner.SameWorker) {
			t.Errorf("node %s: assignment of revision %d has %d workers, want %d of revision 2", node, a.Revision, len(have), len(ws))
		}
	}
	m2, b2 := published(s.planner)
	t.Logf("node %s left with %d workers: %d nodes' assignments published; the planner published %d messages, %d bytes; largest message on the server %d bytes",
		victim, len(before[victim]), len(got), m2-msgs, b2-bytes, s.largest.n.Load())
	if s.largest.n.Load() > wire.MaxMessage {
		t.Errorf("a message of %d bytes: over 1 MB", s.largest.n.Load())
	}
}

// scale is a running planner on n simulated nodes, on an embedded server
// with NATS's default limits.
type scale struct {
	js jetstream.JetStream
	c  *client.Client
	// planner is the planner's own connection, to count what it sends.
	planner *nats.Conn
	largest *largest
	url     string
	// reg is the planner's metrics.
	reg *prometheus.Registry
}

// replans is how many replans the planner finished, and how many of
// them published a revision.
func (s *scale) replans(tb testing.TB) (done, published int) {
	tb.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "poolplanner_replan_duration_seconds":
				done = int(m.GetHistogram().GetSampleCount())
			case "poolplanner_inventory_change_to_publish_seconds":
				published = int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return done, published
}

// replanSeconds is the time the planner's finished replans took, in all.
func (s *scale) replanSeconds(tb testing.TB) float64 {
	tb.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "poolplanner_replan_duration_seconds" {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
			}
			return sum
		}
	}
	return 0
}

// waitPublished waits until the planner finished the replan that
// published its nth revision, and returns how many replans it finished.
func (s *scale) waitPublished(tb testing.TB, n int) int {
	tb.Helper()
	var done int
	natstest.WaitFor(tb, time.Minute, fmt.Sprintf("the replan of revision %d done", n), func() bool {
		var published int
		done, published = s.replans(tb)
		return published >= n
	})
	return done
}

// startScale fills the inventory bucket with n nodes, then starts a
// planner with no debounce on its own connection.
func startScale(t testing.TB, n int) *scale {
	t.Helper()
	srv := natstest.Start(t)
	url := srv.URL()
	s := &scale{url: url, reg: prometheus.NewRegistry()}
	nc := srv.Conn(t)
	if nc.MaxPayload() != 1<<20 {
		t.Fatalf("server max_payload %d: the test is for NATS's default, 1 MB", nc.MaxPayload())
	}
	s.js, _ = jetstream.New(nc)
	s.c, _ = client.New(nc)
	fillBucket(t, s.js, n)
	s.largest = watchLargest(t, url)
	s.planner = srv.Conn(t)
	pjs, _ := jetstream.New(s.planner)
	ctx, cancel := context.WithCancel(context.Background())
	p := New(Config{NC: s.planner, JS: pjs, Spec: []byte(scaleSpec(n)), Log: zerolog.Nop(), Metrics: metrics.NewPlanner(s.reg)})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("planner: %v", err)
		}
	})
	return s
}

// assignmentsSince reads the assignments stored after sequence since,
// by node, waiting up to a few seconds for at least want of them.
func assignmentsSince(t *testing.T, st jetstream.Stream, since uint64, want int) map[string]*client.Assignment {
	t.Helper()
	ctx := context.Background()
	out := map[string]*client.Assignment{}
	seq := since + 1
	natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d assignments stored after sequence %d", want, since), func() bool {
		for {
			m, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return len(out) >= want
			}
			if err != nil {
				t.Fatal(err)
			}
			var a client.Assignment
			if err := wire.Decode(m.Data, m.Header, &a); err != nil {
				t.Fatalf("assignment at %d: %v", seq, err)
			}
			node := client.AssignmentNode("default", m.Subject)
			if _, dup := out[node]; dup {
				t.Errorf("node %s: two assignments for one revision", node)
			}
			out[node] = &a
			seq++
		}
	})
	return out
}

// byNode is each node's workers in doc, by component and index.
func byNode(doc *plan.Document) map[string][]plan.Worker {
	out := map[string][]plan.Worker{}
	for _, w := range doc.Workers.All() {
		out[w.NodeID] = append(out[w.NodeID], *w)
	}
	for _, ws := range out {
		sortWorkers(ws)
	}
	return out
}

func sortWorkers(ws []plan.Worker) {
	slices.SortFunc(ws, func(a, b plan.Worker) int {
		if a.Component != b.Component {
			return strings.Compare(string(a.Component), string(b.Component))
		}
		return a.Index - b.Index
	})
}

// waitPlan waits for revision rev of the default plan, rebuilt; it fails
// when another revision comes first, or none in time.
func waitPlan(t testing.TB, c *client.Client, rev int, within time.Duration) *client.Revision {
	t.Helper()
	var got *client.Revision
	natstest.WaitFor(t, within, fmt.Sprintf("revision %d", rev), func() bool {
		r, err := c.Plan(context.Background(), "default", 0)
		if err != nil || r.Document.Revision < rev {
			return false
		}
		if r.Document.Revision != rev {
			t.Fatalf("latest revision %d, want %d", r.Document.Revision, rev)
		}
		got = r
		return true
	})
	return got
}

// checkEveryWorkerOnce: every worker the spec asks for is on exactly one
// node's assignment subject.
func checkEveryWorkerOnce(t *testing.T, c *client.Client, doc *plan.Document) {
	t.Helper()
	seen := map[string]string{}
	err := c.Assignments(context.Background(), doc.Name, func(a *client.Assignment) bool {
		for _, pw := range a.Workers {
			k := fmt.Sprint(pw.Component, "/", pw.Index)
			if other, dup := seen[k]; dup {
				t.Errorf("worker %s on both %s and %s", k, other, a.NodeID)
			}
			seen[k] = a.NodeID
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range doc.Demands {
		for i := range d.Workers {
			if _, ok := seen[fmt.Sprint(d.Component, "/", i)]; !ok {
				t.Fatalf("worker %s/%d on no node's subject", d.Component, i)
			}
		}
	}
}

// BenchmarkNodeLeaves is the time from a node's inventory key being
// deleted to the new assignment of a node that takes its workers
// reaching that node's subscriber, with no debounce; and the bytes the
// planner published for the revision (events, snapshots, assignments:
// headers and bodies). Each round a node with workers leaves and comes
// back empty, outside the clock, so the cluster keeps its spare room.
func BenchmarkNodeLeaves(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchNodeLeaves(b, n) })
	}
}

func benchNodeLeaves(b *testing.B, n int) {
	s := startScale(b, n)
	ctx := context.Background()
	first := waitPlan(b, s.c, 1, 5*time.Minute)
	if !first.Document.Valid() {
		b.Fatalf("revision 1 invalid: %s", first.Document.Error)
	}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	follow, err := s.c.Follow(fctx, "default", client.FollowOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cur := <-follow
	// A launcher's view: every assignment as it arrives, by revision.
	arrived := make(chan *nats.Msg, 1024)
	nc, err := nats.Connect(s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	asub, err := nc.ChanSubscribe(client.AssignmentSubjectPrefix+"default.>", arrived)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = asub.Unsubscribe() }()
	_ = nc.Flush()
	invs := store.NewInventoryStore(s.js)
	rev := cur.Document.Revision
	var sent uint64
	var took, slowest time.Duration
	var replanning float64
	var cpu time.Duration
	k := 0
	for b.Loop() {
		victim := cur.Document.Workers.At(k * 7919 % cur.Document.Workers.Len()).NodeID
		k++
		_, before := published(s.planner)
		spent := s.replanSeconds(b)
		c0 := processCPU()
		t0 := time.Now()
		if err := invs.Delete(ctx, victim, time.Minute); err != nil {
			b.Fatal(err)
		}
		rev++
		want := strconv.Itoa(rev)
	wait:
		for {
			select {
			case m := <-arrived:
				if m.Header.Get(client.RevisionHeader) == want && client.AssignmentNode("default", m.Subject) != victim {
					break wait
				}
			case <-time.After(time.Minute):
				b.Fatalf("no assignment of revision %d", rev)
			}
		}
		took += time.Since(t0)
		cpu += processCPU() - c0
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
		b.StopTimer()
		select {
		case cur = <-follow:
		case <-time.After(time.Minute):
			b.Fatalf("revision %d not followed", rev)
		}
		if cur.Document.Revision != rev {
			b.Fatalf("followed revision %d, want %d", cur.Document.Revision, rev)
		}
		done := s.waitPublished(b, rev)
		replanning += s.replanSeconds(b) - spent
		if _, err := invs.Put(ctx, victim, simDoc(victim), false, time.Hour); err != nil {
			b.Fatal(err)
		}
		// The node is back: a replan, and no revision.
		natstest.WaitFor(b, time.Minute, "a replan on the node back", func() bool {
			n, _ := s.replans(b)
			return n > done
		})
		_, after := published(s.planner)
		sent += after - before
		for len(arrived) > 0 {
			<-arrived
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(k), "ms-to-assignment/op")
	b.ReportMetric(float64(sent)/float64(k), "B-published/op")
	b.ReportMetric(float64(slowest.Milliseconds()), "ms-slowest")
	// The planner's own share: the leave's replan, from the loop taking
	// it up to its last assignment published.
	b.ReportMetric(1000*replanning/float64(k), "ms-replan/op")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(k), "process-cpu-ms/op")
}

// TestHundredThousandNodes: a plan of 100,000 nodes (375,000 workers of
// 2 GPUs, and a buffer per training node) publishes on NATS's default
// limits, no message over 1 MB; it rebuilds by the documented scheme,
// every worker is on exactly one node's assignment subject, and a node
// leaving costs a small change event. The inventory goes straight into
// the planner's view: the bucket's part is TestScaleNodeLeaves's.
func TestHundredThousandNodes(t *testing.T) {
	long(t, "100,000 nodes")
	const n = 100_000
	h := newHarness(t)
	largest := watchLargest(t, h.nc.ConnectedUrl())
	ctx := context.Background()
	p := drive(New(Config{NC: h.nc, JS: h.js, Settle: -1, Log: zerolog.Nop()}))
	latest, err := p.start(ctx)
	if err != nil || latest != nil {
		t.Fatalf("start: %v, latest %v", err, latest)
	}
	gpus := 8 * (n - n/16)
	spec, err := planner.ParseSpec(fmt.Appendf(nil, `
scheduling:
  train:  {worker_num: %d, num_cpus: 1, num_gpus: 2}
  eval:   {worker_num: %d, num_cpus: 1, num_gpus: 2}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`, gpus/4, gpus/4))
	if err != nil {
		t.Fatal(err)
	}
	p.own().spec, p.own().digest = spec, SpecDigest(spec)
	sim, _ := inventory.ParseSimulation("8xH100")
	for i := range n {
		id := scaleNode(i)
		inv := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}.Inventory()
		inv.GPUs = inventory.SimulatedGPUs(id, sim)
		_, _ = p.live.put(id, inv)
	}
	t0 := time.Now()
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	c := wireClient(p)
	first, err := c.Plan(ctx, "default", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Document.Valid() || first.Document.Workers.Len() < gpus/2 {
		t.Fatalf("revision 1: valid %v, %d workers: %s", first.Document.Valid(), first.Document.Workers.Len(), first.Document.Error)
	}
	if got, want := string(first.Document.AppendJSON(nil)), string(p.own().latest.Plan.AppendJSON(nil)); got != want {
		t.Fatal("revision 1 rebuilt differs from what the planner computed")
	}
	checkEveryWorkerOnce(t, c, first.Document)
	t.Logf("revision 1 of %d nodes, %d workers: a %s event, published in %v", n, first.Document.Workers.Len(), first.Event.Kind(), took)

	victim := first.Document.Workers.At(0).NodeID
	p.live.remove(victim)
	if err := p.replan(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := lastEvent(ctx, h.js)
	if err != nil {
		t.Fatal(err)
	}
	if kind := m.Header.Get(client.KindHeader); kind != "change" || len(m.Data) > 64<<10 {
		t.Errorf("revision 2 after one node left: a %s event of %d bytes", kind, len(m.Data))
	}
	largest.sync(t, h.nc)
	if largest.n.Load() > wire.MaxMessage {
		t.Errorf("a message of %d bytes: over 1 MB", largest.n.Load())
	}
	t.Logf("revision 2: a %s event of %d bytes; largest message on the server %d bytes", m.Header.Get(client.KindHeader), len(m.Data), largest.n.Load())
}

// lastEvent is the default plan's newest event as the stream holds it.
func lastEvent(ctx context.Context, js jetstream.JetStream) (*jetstream.RawStreamMsg, error) {
	st, err := js.Stream(ctx, client.PlansStream)
	if err != nil {
		return nil, err
	}
	return st.GetLastMsgForSubject(ctx, client.PlanEventSubject("default"))
}
