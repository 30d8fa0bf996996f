package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/testcluster"
	"github.com/poolplanner/poolplanner/plan"
)

const chaosSpec = `
scheduling:
  train:  {worker_num: 16, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 2, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 16, num_cpus: 1, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// Chaos timing: reporters' heartbeat and TTL, the planners' debounce and
// lease. bound is how soon the design wants a churn event in a published
// plan: TTL + debounce + lease TTL + 1 s; the test logs each event's
// time against it. limit is what fails the test: a churn event that
// waits for several times the bound is lost, not late, however loaded
// the machine (a wall-clock bound as tight as the design's flakes there).
const (
	chaosBeat     = 500 * time.Millisecond
	chaosTTL      = 2 * time.Second
	chaosDebounce = 100 * time.Millisecond
	chaosLease    = time.Second
	chaosSettle   = 3 * time.Second
	chaosBound    = chaosTTL + chaosDebounce + chaosLease + time.Second
	chaosLimit    = 5 * chaosBound
)

// sickSource is a simulated node whose GPUs can turn unhealthy.
type sickSource struct {
	mu  sync.Mutex
	inv inventory.NodeInventory
	ch  chan struct{}
}

func newSickSource(id string, i int) *sickSource {
	sim, _ := inventory.ParseSimulation("8xH100")
	inv := inventory.Facts{NodeID: id, Hostname: id, IP: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), CPUs: 64}.Inventory()
	inv.GPUs = inventory.SimulatedGPUs(id, sim)
	return &sickSource{inv: inv, ch: make(chan struct{}, 1)}
}

func (s *sickSource) Inventory(context.Context) (inventory.NodeInventory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv := s.inv
	inv.GPUs = append([]inventory.GPU(nil), s.inv.GPUs...)
	return inv, nil
}

func (s *sickSource) Changed() <-chan struct{} { return s.ch }

func (s *sickSource) sicken(uuid string) {
	s.mu.Lock()
	for i := range s.inv.GPUs {
		if s.inv.GPUs[i].UUID == uuid {
			s.inv.GPUs[i].Healthy = false
		}
	}
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// millis stamps each log line with its time to the millisecond: its own
// field, since zerolog's time format is the package's, which a parallel
// test must not change.
var millis = zerolog.HookFunc(func(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str("time", time.Now().Format("15:04:05.000"))
})

// chaos is three clustered servers, planners and reporters on them.
type chaos struct {
	t        *testing.T
	c        *testcluster.Cluster
	js       jetstream.JetStream
	conns    []jetstream.JetStream // the reporters', shared
	mu       sync.Mutex
	nodes    map[string]*sickSource
	stops    map[string]context.CancelFunc
	left     map[string]bool // the nodes the test made leave
	next     int
	planners []*instance
	// loaded says when each planner was first seen with its spec loaded
	// (its loop started before).
	loaded map[*instance]chan time.Time
	logs   syncBuffer
}

func (x *chaos) join() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	id := fmt.Sprintf("node-%03d", x.next)
	src := newSickSource(id, x.next)
	js := x.conns[x.next%len(x.conns)]
	x.next++
	ctx, cancel := context.WithCancel(context.Background())
	x.nodes[id], x.stops[id] = src, cancel
	go func() {
		_ = reporter.Run(ctx, reporter.Config{Source: src, Store: store.NewInventoryStore(js), Heartbeat: chaosBeat, TTL: chaosTTL, Log: zerolog.Nop()})
	}()
	return id
}

// leave stops a node's reporter, which deletes its key.
func (x *chaos) leave(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.stops[id]()
	x.left[id] = true
	delete(x.nodes, id)
	delete(x.stops, id)
}

func (x *chaos) planner() *instance {
	nc, err := bus.Connect(x.c.URLs(), "chaos-planner", zerolog.Nop(), bus.Security{})
	if err != nil {
		x.t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{p: New(Config{NC: nc, JS: js, Spec: []byte(chaosSpec), Debounce: chaosDebounce, Settle: chaosSettle,
		LeaseTTL: chaosLease, Replicas: 3, Log: zerolog.New(&x.logs).Hook(millis).With().Str("planner", fmt.Sprint(len(x.planners))).Logger()}), nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		if err := in.p.Run(ctx); err != nil {
			x.t.Errorf("planner: %v", err)
		}
	}()
	x.t.Cleanup(in.stop)
	x.planners = append(x.planners, in)
	// Watched from the start, so that standby knows how long each has
	// run, however long the test took to get there.
	seen := make(chan time.Time, 1)
	x.loaded[in] = seen
	go func() {
		tick := time.NewTicker(natstest.Poll)
		defer tick.Stop()
		for {
			if s, ok := in.p.view().plans[in.p.cfg.Plan]; ok && s.spec != nil {
				seen <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return in
}

func (x *chaos) latest() *planner.Plan {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sp, err := store.NewPlanStore(x.js).Latest(ctx, "default")
	if err != nil || sp == nil {
		return nil
	}
	return sp.Plan
}

// await waits until the latest plan is valid and ok, and returns how long
// it took.
func (x *chaos) await(what string, ok func(*planner.Plan) bool) time.Duration {
	x.t.Helper()
	start := time.Now()
	natstest.WaitFor(x.t, 60*time.Second, "a valid plan with "+what, func() bool {
		p := x.latest()
		return p != nil && p.Valid() && ok(p)
	})
	return time.Since(start)
}

// churn makes one change the plan must answer: a node holding workers
// leaves, or a GPU in use turns unhealthy; and now and then a node
// joins. It returns how long until a valid plan reflected it.
func (x *chaos) churn(rng *rand.Rand) (string, time.Duration) {
	var p *planner.Plan
	x.await("a plan", func(l *planner.Plan) bool { p = l; return true })
	ws := p.Workers.Slice()
	w := ws[rng.IntN(len(ws))]
	for len(w.GPUUUIDs) == 0 {
		w = ws[rng.IntN(len(ws))]
	}
	if rng.IntN(3) == 0 {
		x.join()
	}
	if rng.IntN(2) == 0 {
		x.leave(w.NodeID)
		return "node " + w.NodeID + " left", x.await(w.NodeID+" gone", func(p *planner.Plan) bool { return !onNode(p, w.NodeID) })
	}
	x.mu.Lock()
	src := x.nodes[w.NodeID]
	x.mu.Unlock()
	uuid := w.GPUUUIDs[0]
	src.sicken(uuid)
	return "GPU " + uuid + " unhealthy", x.await(uuid+" unused", func(p *planner.Plan) bool { return !usesGPU(p, uuid) })
}

func usesGPU(p *planner.Plan, uuid string) bool {
	for _, w := range p.Workers.All() {
		for _, u := range w.GPUUUIDs {
			if u == uuid {
				return true
			}
		}
	}
	return false
}

// TestChaos: three clustered servers with R3 state, three planners, 50
// reporters churning; one server is stopped without warning and brought
// back, and separately the leading planner. Every churn event is in a
// valid published plan soon after; the history is 1..N, each once, every
// plan keeps the invariants; no inventory key or spec is lost, and the
// restarted server catches up.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: a minute of clustered servers")
	}
	t.Parallel()
	x := &chaos{t: t, c: testcluster.Start(t, 3, nil), nodes: map[string]*sickSource{}, stops: map[string]context.CancelFunc{}, left: map[string]bool{},
		loaded: map[*instance]chan time.Time{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("planner log:\n%s", x.logs.String())
		}
	})
	nc, err := bus.Connect(x.c.URLs(), "chaos-test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	x.js, _ = jetstream.New(nc)
	for range 5 {
		rc, err := bus.Connect(x.c.URLs(), "chaos-reporters", zerolog.Nop(), bus.Security{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		js, _ := jetstream.New(rc)
		x.conns = append(x.conns, js)
	}
	// The nodes report before any planner starts, so that revision 1
	// plans on all of them: a planner that saw only the first to report
	// would publish an invalid revision 1 (true, but not this test's
	// subject), depending on how fast a loaded machine starts reporters.
	inv := store.NewInventoryStore(x.js)
	inv.Replicas = 3
	ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer icancel()
	if _, err := inv.Ensure(ictx); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		x.join()
	}
	natstest.WaitFor(t, 30*time.Second, "50 nodes in the inventory", func() bool {
		docs, err := inv.List(ictx)
		return err == nil && len(docs) == 50
	})
	for range 3 {
		x.planner()
	}
	t.Cleanup(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		for _, stop := range x.stops {
			stop()
		}
	})
	x.await("every node", func(p *planner.Plan) bool { return p.Revision >= 1 })
	x.standby()

	rng := rand.New(rand.NewPCG(1, 2))
	var worst time.Duration
	var report []string
	step := func(phase string) {
		what, took := x.churn(rng)
		worst = max(worst, took)
		if took > chaosLimit {
			t.Errorf("%s: %s: in a plan only after %s, limit %s", phase, what, took, chaosLimit)
		}
		report = append(report, fmt.Sprintf("%s: %s: in a plan after %s", phase, what, took.Round(10*time.Millisecond)))
	}
	for range 4 {
		step("steady")
	}
	// A server goes without warning: the one the test's connection uses
	// is as good as any.
	down := x.c.Index(nc.ConnectedUrl())
	x.c.StopServer(down)
	for range 4 {
		step(fmt.Sprintf("server s%d down", down))
	}
	x.c.StartServer(down)
	for range 2 {
		step(fmt.Sprintf("server s%d back", down))
	}
	// The leading planner dies without a word.
	// The leader is the lease's holder (a planner that lost its lease
	// believes it leads until its next renewal).
	plans := store.NewPlanStore(x.js)
	lease := func() *bus.Lease {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if l, err := plans.ReadLease(ctx, "default"); err == nil && l != nil {
			return l
		}
		return &bus.Lease{}
	}
	holder := func() string { return lease().Holder }
	var leader *instance
	natstest.WaitFor(t, 10*time.Second, "a planner leading", func() bool {
		h := holder()
		for _, in := range x.planners {
			if in.p.plans.Publisher() == h {
				leader = in
			}
		}
		return leader != nil
	})
	leader.crash()
	crashed := time.Now()
	for range 4 {
		step("leader killed")
	}
	// A standby leads by now (it published the steps' plans); its
	// lease says since when.
	var took time.Duration
	natstest.WaitFor(t, time.Minute, "a standby leading", func() bool {
		l := lease()
		took = l.Since.Sub(crashed)
		return l.Holder != "" && l.Holder != leader.p.plans.Publisher()
	})
	report = append(report, fmt.Sprintf("leader killed: a standby led %s after (lease TTL %s)", took.Round(10*time.Millisecond), chaosLease))
	x.planner()
	for range 2 {
		step("planner back")
	}
	for _, line := range report {
		t.Log(line)
	}
	t.Logf("slowest: %s (bound: TTL %s + debounce %s + lease TTL %s + 1s = %s; over it: %v)", worst, chaosTTL, chaosDebounce, chaosLease, chaosBound, worst > chaosBound)

	x.checkHistory()
	x.checkInventory()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range []string{client.PlansStream, bus.InventoryStream, "KV_" + client.SpecBucket, client.AssignmentsStream} {
		testcluster.WaitCurrent(ctx, t, x.js, name)
	}
	if strings.Contains(x.logs.String(), `"level":"error"`) {
		t.Logf("planner errors (allowed while a server is down):\n%s", x.logs.String())
	}
}

// standby waits until every planner runs (its spec loaded) and has
// been running for longer than the settle time, so that a standby that
// takes over replans at once.
func (x *chaos) standby() {
	x.t.Helper()
	for _, in := range x.planners {
		var at time.Time
		select {
		case at = <-x.loaded[in]:
			x.loaded[in] <- at // for a later call
		case <-time.After(60 * time.Second):
			x.t.Fatal("not every planner started within 1m0s")
		}
		// The settle is a span from the planner's start, not a state the
		// planner shows: waiting it out is the condition. It started
		// before its spec was seen loaded, and the test's wait for the
		// first revision often outlasted the settle already.
		natstest.WaitFor(x.t, chaosSettle+10*time.Second, "the settle over", func() bool { return time.Since(at) > chaosSettle })
	}
}

// andMore is how a reason ends a list it shortens.
var andMore = regexp.MustCompile(` and \d+ more$`)

// checkHistory: revisions 1..N, each once, every one valid and keeping
// the invariants a plan can be checked for without its inventory.
func (x *chaos) checkHistory() {
	x.t.Helper()
	var revs []int
	plans := store.NewPlanStore(x.js)
	read := func(fn func(client.Info) bool) error {
		return plans.Client().History(context.Background(), "default", fn)
	}
	// Right after the last step a server that came back may still be
	// taking part in electing the stream's leader, whose API then has no
	// responders for a moment: read once it answers.
	natstest.WaitFor(x.t, 30*time.Second, "the plan history readable", func() bool {
		return !errors.Is(read(func(client.Info) bool { return false }), nats.ErrNoResponders)
	})
	err := read(func(i client.Info) bool {
		revs = append(revs, i.Revision)
		// A node no test step stopped must never leave: its key outlives
		// any one server (its reporter heartbeats through the others).
		if _, rest, ok := strings.Cut(i.Reason, "nodes left: "); ok {
			list, _, _ := strings.Cut(rest, ";")
			// A long list ends "... and N more": the ids named are
			// checked.
			list = andMore.ReplaceAllString(list, "")
			for _, id := range strings.Split(list, ", ") {
				if !x.left[id] {
					x.t.Errorf("revision %d: node %s left, but the test never stopped it: %s", i.Revision, id, i.Reason)
				}
			}
		}
		return true
	})
	if err != nil {
		x.t.Fatal(err)
	}
	for i, r := range revs {
		if r != i+1 {
			x.t.Fatalf("revisions %v: want 1..%d, each once", revs, len(revs))
		}
	}
	spec, _ := planner.ParseSpec([]byte(chaosSpec))
	for _, r := range revs {
		sp, err := plans.Revision(context.Background(), "default", r)
		if err != nil {
			x.t.Fatalf("revision %d: %v", r, err)
		}
		if errs := lightInvariants(spec, sp.Plan); len(errs) > 0 {
			x.t.Errorf("revision %d: %v", r, errs)
		}
	}
	x.t.Logf("%d revisions, 1..%d, each once, all valid", len(revs), len(revs))
}

// lightInvariants: valid; every component's workers all placed, indices
// 0..n-1; no GPU shared beyond 1.0; a GPU on one node only.
func lightInvariants(spec *planner.Spec, p *planner.Plan) []string {
	var errs []string
	if !p.Valid() {
		return []string{"invalid: " + p.Error}
	}
	want := map[plan.Component]int{plan.Train: spec.Scheduling.Train.WorkerNum, plan.Eval: spec.Scheduling.Eval.WorkerNum, plan.Env: spec.Scheduling.Env[0].WorkerNum}
	idx := map[plan.Component][]int{}
	share := map[string]float64{}
	node := map[string]string{}
	for _, w := range p.Workers.All() {
		idx[w.Component] = append(idx[w.Component], w.Index)
		for _, u := range w.GPUUUIDs {
			share[u] += w.GPUShare
			if n, ok := node[u]; ok && n != w.NodeID {
				errs = append(errs, fmt.Sprintf("GPU %s on %s and %s", u, n, w.NodeID))
			}
			node[u] = w.NodeID
		}
	}
	for c, n := range want {
		got := idx[c]
		sort.Ints(got)
		for i, v := range got {
			if v != i {
				errs = append(errs, fmt.Sprintf("%s indices %v", c, got))
				break
			}
		}
		if len(got) != n {
			errs = append(errs, fmt.Sprintf("%s: %d workers, want %d", c, len(got), n))
		}
	}
	for u, s := range share {
		if s > 1+1e-9 {
			errs = append(errs, fmt.Sprintf("GPU %s shared %.2f", u, s))
		}
	}
	return errs
}

// checkInventory: the bucket holds exactly the running reporters' keys.
func (x *chaos) checkInventory() {
	x.t.Helper()
	natstest.WaitFor(x.t, chaosTTL+5*time.Second, "the inventory keys the running reporters'", func() bool {
		kv, err := x.js.KeyValue(context.Background(), client.InventoryBucket)
		var keys, want []string
		if err == nil {
			var lister jetstream.KeyLister
			if lister, err = kv.ListKeys(context.Background()); err == nil {
				for k := range lister.Keys() {
					keys = append(keys, k)
				}
			}
		}
		x.mu.Lock()
		for id := range x.nodes {
			want = append(want, id)
		}
		x.mu.Unlock()
		sort.Strings(keys)
		sort.Strings(want)
		return err == nil && fmt.Sprint(keys) == fmt.Sprint(want)
	})
	spec, _, err := store.NewSpecStore(x.js).Get(context.Background(), "default")
	if err != nil || string(spec) != chaosSpec {
		x.t.Errorf("spec lost: %v", err)
	}
}
