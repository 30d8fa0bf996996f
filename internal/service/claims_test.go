package service

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// claimant is node id's document of 8 simulated H100s, with GPU i of
// each steal naming another node's GPU's UUID: steal[i] = "NODE:GPU".
func claimant(id string, steal map[int]string) inventory.NodeInventory {
	var doc inventory.NodeInventory
	_ = json.Unmarshal(simDoc(id), &doc)
	for i, from := range steal {
		node, gpu, _ := strings.Cut(from, ":")
		var g int
		_, _ = fmt.Sscan(gpu, &g)
		doc.GPUs[i].UUID = inventory.SimulatedUUID(node, g)
	}
	return doc
}

// oneNodePerUUID fails when a UUID is usable (healthy) on two of the
// planner's nodes, or a plan's workers sit on one UUID on two nodes.
func oneNodePerUUID(t testing.TB, nodes []planner.Node, plans ...*planner.Plan) {
	t.Helper()
	seen := map[string]string{}
	for _, n := range nodes {
		for i, u := range n.GPUUUIDs {
			if !n.Healthy(i) {
				continue
			}
			if o, ok := seen[u]; ok && o != n.ID {
				t.Fatalf("UUID %s usable on %s and %s", u, o, n.ID)
			}
			seen[u] = n.ID
		}
	}
	for _, p := range plans {
		on := map[string]string{}
		for _, w := range p.Workers.All() {
			for _, u := range w.GPUUUIDs {
				if o, ok := on[u]; ok && o != w.NodeID {
					t.Fatalf("plan %s revision %d: UUID %s on %s and %s", p.Name, p.Revision, u, o, w.NodeID)
				}
				on[u] = w.NodeID
			}
		}
	}
}

// TestClaimsInTheView: the lead's view and a sibling's, fed events as
// the loop feeds them (siblings first) and resyncs, agree on every
// document; a GPU whose UUID another node holds is unhealthy on the
// later node, with a reason naming the holder, and counted (refusals,
// and the conflicts gauge); the UUID passes at once when the holder
// leaves, a handover counted, and back to it when it returns (the
// node whose history held it first); a resync of new nodes gives it to
// the first by id.
func TestClaimsInTheView(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p := drive(New(Config{Log: zerolog.Nop(), Metrics: metrics.NewPlanner(reg)}))
	own, s := p.addState("default"), p.addState("exp")
	stolen := inventory.SimulatedUUID("a", 0)
	a, b, c := claimant("a", nil), claimant("b", map[int]string{3: "a:0"}), claimant("c", map[int]string{5: "a:0"})
	changed := func(d inventory.NodeInventory) store.Event {
		return store.Event{Op: store.Changed, NodeID: d.NodeID, Inventory: d}
	}
	left := func(id string) store.Event {
		return store.Event{Op: store.Removed, NodeID: id, Reason: store.ReasonDeleted}
	}
	rejected := func(id string) store.Event {
		return store.Event{Op: store.Rejected, NodeID: id, Reason: "bad", Rejection: store.RejectInvalid}
	}
	type want struct {
		holder  string   // of the stolen UUID
		refused []string // "NODE:GPU" unhealthy for it
		changes string   // the lead's change log since the step before
		// refusals and handovers counted in the step
		refusals, handovers float64
	}
	for i, st := range []struct {
		events []store.Event
		resync []inventory.NodeInventory // else events
		// rebeat: a resync that saw only heartbeats (the loop takes
		// each node's document from Planner.node)
		rebeat bool
		want   want
	}{
		{events: []store.Event{changed(a)}, want: want{holder: "a", changes: "nodes joined: a"}},
		{events: []store.Event{changed(b)}, want: want{holder: "a", refused: []string{"b:3"}, changes: "nodes joined: b", refusals: 1}},
		// A change of nothing is no change; nor a resync of heartbeats.
		{events: []store.Event{changed(b)}, want: want{holder: "a", refused: []string{"b:3"}}},
		{rebeat: true, want: want{holder: "a", refused: []string{"b:3"}}},
		{events: []store.Event{left("a")}, want: want{holder: "b", changes: "nodes left: a; nodes changed: b", handovers: 1}},
		// Back, a takes its GPU back from b (its history held it first).
		{events: []store.Event{changed(a)}, want: want{holder: "a", refused: []string{"b:3"}, changes: "nodes joined: a; GPUs unhealthy: b:3", handovers: 1}},
		// A resync: b's document is gone; c is new. a (known) holds.
		{resync: []inventory.NodeInventory{a, c}, want: want{holder: "a", refused: []string{"c:5"}, changes: "nodes joined: c; nodes left: b",
			refusals: 1}},
		// A rejected document is the node leaving.
		{events: []store.Event{rejected("a")}, want: want{holder: "c", changes: "nodes left: a; nodes changed: c", handovers: 1}},
	} {
		before := scraped(t, reg)
		if st.rebeat {
			for _, id := range p.live.present() {
				d, _ := p.node(id)
				st.resync = append(st.resync, d)
			}
		}
		if st.resync != nil {
			nodes := map[string]inventory.NodeInventory{}
			for _, d := range st.resync {
				nodes[d.NodeID] = d
			}
			p.replaceNodes(nodes)
		} else {
			for _, ev := range st.events {
				p.apply(ev)
			}
		}
		nodes := p.live.planNodes()
		oneNodePerUUID(t, nodes)
		if h := p.live.claims.Holder(stolen); h != st.want.holder {
			t.Errorf("step %d: holder %q, want %q", i, h, st.want.holder)
		}
		var refused []string
		for _, n := range nodes {
			for _, g := range n.Unhealthy {
				refused = append(refused, fmt.Sprintf("%s:%d", n.ID, g))
				doc, _ := p.live.doc(n.ID)
				if r := doc.GPUs[g].UnhealthyReason; r != inventory.ClaimedReason(stolen, st.want.holder) {
					t.Errorf("step %d: %s:%d's reason %q", i, n.ID, g, r)
				}
			}
		}
		if fmt.Sprint(refused) != fmt.Sprint(st.want.refused) {
			t.Errorf("step %d: unhealthy %v, want %v", i, refused, st.want.refused)
		}
		// Every plan's change log says the same.
		if got, other := strings.Join(own.changes(&p.live), "; "), strings.Join(s.changes(&p.live), "; "); got != st.want.changes || other != got {
			t.Errorf("step %d: changes %q, the other plan's %q; want %q", i, got, other, st.want.changes)
		}
		clear(own.basis)
		clear(s.basis)
		p.cfg.Metrics.Inventory(p.inventorySize()) // as the loop's guard does
		after := scraped(t, reg)
		for _, c := range []struct {
			key  string
			want float64
		}{
			{`poolplanner_gpu_uuid_claims_total{outcome="refused"}`, st.want.refusals},
			{`poolplanner_gpu_uuid_claims_total{outcome="handover"}`, st.want.handovers},
		} {
			if got := after[c.key] - before[c.key]; got != c.want {
				t.Errorf("step %d: %s rose by %v, want %v", i, c.key, got, c.want)
			}
		}
		if got := after["poolplanner_gpu_uuid_conflicts"]; got != float64(len(st.want.refused)) {
			t.Errorf("step %d: poolplanner_gpu_uuid_conflicts %v, want %d", i, got, len(st.want.refused))
		}
	}

	// A planner that reads nodes new to it in one batch gives a UUID to
	// the first by id, whatever the map's order.
	for range 5 {
		q := drive(New(Config{Log: zerolog.Nop()}))
		q.replaceNodes(map[string]inventory.NodeInventory{"c": c, "b": b, "a": a})
		if h := q.live.claims.Holder(stolen); h != "a" {
			t.Fatalf("a fresh planner's holder %q, want a", h)
		}
		oneNodePerUUID(t, q.live.planNodes())
	}
}

// inventoryOf is node id's document as the planner plans on it (and the
// GPU map shows it).
func inventoryOf(p *Service, id string) inventory.NodeInventory {
	for _, d := range p.Inventory() {
		if d.NodeID == id {
			return d
		}
	}
	return inventory.NodeInventory{}
}

// staticSource is a node's fixed inventory, for a reporter.
type staticSource struct{ doc inventory.NodeInventory }

func (s staticSource) Inventory(context.Context) (inventory.NodeInventory, error) { return s.doc, nil }
func (staticSource) Changed() <-chan struct{}                                     { return nil }

// TestTwoReportersOneUUID: two simulated reporters, the second claiming
// the first's GPU 0 as its GPU 3. The first keeps it; the second's GPU 3
// is refused, and no plan ever places workers on one UUID on two nodes.
// When the first leaves, the UUID passes at once to the second; back,
// the first takes it back (its history held it: the second squatted it)
// and the second is refused it.
func TestTwoReportersOneUUID(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// z1 reports first but sorts last: the first claim is the first
	// event, not the first id.
	first, second := claimant("z1", nil), claimant("a2", map[int]string{3: "z1:0"})
	stolen := first.GPUs[0].UUID
	plans := store.NewPlanStore(h.js)
	if err := plans.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	revs, err := plans.Follow(ctx, "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	// The guard says the conflict and sets its gauge, and the lease
	// carries it at its next renewal (a third of its TTL): the test
	// waits for both, six times.
	p := drive(New(Config{NC: h.nc, JS: h.js, Spec: []byte(shareSpec(15, 0)), Debounce: 20 * time.Millisecond, Settle: -1, LeaseTTL: time.Second,
		guardRound: quickGuard, Log: zerolog.New(&logs), Metrics: metrics.NewPlanner(reg)}))
	pctx, stopPlanner := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(pctx) }()
	defer func() { stopPlanner(); <-done }()

	next := func(what string, ok func(*planner.Plan) bool) *planner.Plan {
		t.Helper()
		for {
			select {
			case sp, open := <-revs:
				if !open {
					t.Fatalf("no revision %s", what)
				}
				nodes := p.view().nodes
				oneNodePerUUID(t, nodes, sp.Plan)
				if ok(sp.Plan) {
					return sp.Plan
				}
			case <-ctx.Done():
				t.Fatalf("no revision %s; logs:\n%s", what, logs.String())
			}
		}
	}
	next("1", func(*planner.Plan) bool { return true }) // read the (empty) bucket: events follow in order

	inv := store.NewInventoryStore(h.js)
	report := func(doc inventory.NodeInventory) (stop func()) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- reporter.Run(rctx, reporter.Config{Source: staticSource{doc}, Store: inv, Heartbeat: time.Second, TTL: 30 * time.Second, Log: zerolog.Nop()})
		}()
		kv, err := inv.KV(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w, err := kv.Watch(ctx, doc.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e != nil && len(e.Value()) > 0 {
				break
			}
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("reporter %s: %v", doc.NodeID, err)
			}
		}
	}
	uses := func(pl *planner.Plan, node string, uuid string) bool {
		return slices.ContainsFunc(pl.OnNode(node), func(w plan.Worker) bool { return slices.Contains(w.GPUUUIDs, uuid) })
	}

	stopFirst := report(first)
	stopSecond := report(second)
	defer stopSecond()
	both := next("of 15 workers on 15 GPUs", func(pl *planner.Plan) bool { return pl.Valid() && pl.Workers.Len() == 15 })
	if !uses(both, "z1", stolen) || uses(both, "a2", stolen) {
		t.Errorf("revision %d: the stolen UUID on z1 %v, on a2 %v; want z1 only", both.Revision, uses(both, "z1", stolen), uses(both, "a2", stolen))
	}
	// The inventory's document says the claim, and the metrics count it
	// (the gauge as the loop's guard sets it, every 2 s).
	if g := inventoryOf(p.Service, "a2").GPUs[3]; g.Healthy || !strings.Contains(g.UnhealthyReason, "held by node z1") {
		t.Errorf("a2's GPU 3 in the inventory: %+v", g)
	}
	waitScraped(t, reg, "one GPU refused", func(m map[string]float64) bool {
		return m["poolplanner_gpu_uuid_conflicts"] == 1 && m[`poolplanner_gpu_uuid_claims_total{outcome="refused"}`] == 1
	})
	// The leader's lease names the conflict (planner status's PROBLEM
	// lines): the UUID, its holder, the node refused it.
	conflict := "GPU UUID conflict: " + stolen + " held by node z1, listed by node a2 too: refused to a2"
	saysConflict := func(want bool) {
		t.Helper()
		natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("the lease naming the conflict: %v", want), func() bool {
			l, err := plans.ReadLease(ctx, "default")
			return err == nil && l != nil && slices.Contains(l.Problems, conflict) == want &&
				!slices.ContainsFunc(l.Problems, func(p string) bool { return strings.Contains(p, "GPU UUID conflict") && p != conflict })
		})
	}
	saysConflict(true)
	// As reported, for a resync that only sees a heartbeat. (Read from
	// the loop's state once it is idle: only the loop writes it.)
	ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
	defer icancel()
	if err := p.Idle(ictx); err != nil {
		t.Fatal(err)
	}
	if doc, _ := p.node("a2"); !doc.GPUs[3].Healthy || doc.GPUs[3].UUID != stolen {
		t.Errorf("a2's GPU 3 as reported: %+v", doc.GPUs[3])
	}

	// z1 leaves: a2 has its GPU 3 at once, 8 GPUs of the 15 needed.
	stopFirst()
	next("of a2's 8 GPUs", func(pl *planner.Plan) bool {
		return !pl.Valid() && strings.Contains(pl.Error, "Insufficient GPUs: required 15.0, available 8")
	})
	if g := inventoryOf(p.Service, "a2").GPUs[3]; !g.Healthy {
		t.Errorf("a2's GPU 3 after z1 left: %+v", g)
	}
	waitScraped(t, reg, "the UUID handed over, no GPU refused", func(m map[string]float64) bool {
		return m["poolplanner_gpu_uuid_conflicts"] == 0 && m[`poolplanner_gpu_uuid_claims_total{outcome="handover"}`] == 1
	})
	saysConflict(false)
	// z1 comes back and takes its GPU 0 back: the squatter loses it.
	stopFirst = report(first)
	defer stopFirst()
	back := next("of 15 workers again", func(pl *planner.Plan) bool {
		return pl.Valid() && pl.Workers.Len() == 15 && len(pl.OnNode("z1")) > 0
	})
	if !uses(back, "z1", stolen) || uses(back, "a2", stolen) {
		t.Errorf("revision %d: the stolen UUID on z1 %v, on a2 %v; want z1 only", back.Revision, uses(back, "z1", stolen), uses(back, "a2", stolen))
	}
	waitScraped(t, reg, "the UUID handed back, a2's GPU refused", func(m map[string]float64) bool {
		return m["poolplanner_gpu_uuid_conflicts"] == 1 && m[`poolplanner_gpu_uuid_claims_total{outcome="handover"}`] == 2
	})
	saysConflict(true)
	// Every revision published, not only those followed.
	for _, pl := range h.history() {
		oneNodePerUUID(t, nil, pl)
	}
}

// TestLongPlanNameLookup: a lookup naming a plan of 4,100 bytes (past
// the server's 4 KB control line as a subject) is a 400 naming the
// rule, and the planner's connection stays up to answer the next.
func TestLongPlanNameLookup(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.node("n1")
	plans := store.NewPlanStore(h.js)
	if err := plans.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	revs, err := plans.Follow(ctx, "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := h.planner(ctx, shareSpec(2, 0))
	defer stop()
	select {
	case <-revs:
	case <-ctx.Done():
		t.Fatal("no revision 1")
	}
	long := strings.Repeat("p", 4100)
	for _, req := range []string{
		fmt.Sprintf(`{"plan": %q, "component": "train", "index": 0}`, long),
		fmt.Sprintf(`{"plan": %q, "node_id": "n1"}`, long),
	} {
		reply, err := h.nc.RequestWithContext(ctx, client.LookupSubject, []byte(req))
		if err != nil {
			t.Fatal(err)
		}
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != wire.CodeBadRequest || !strings.Contains(string(reply.Data), "invalid plan name") ||
			!strings.Contains(string(reply.Data), "4100 bytes is too long; want 1 to 64 bytes") {
			t.Errorf("lookup: code %q, %s", code, reply.Data)
		}
	}
	reply, err := h.nc.RequestWithContext(ctx, client.PlanSubject, []byte(fmt.Sprintf(`{"plan": %q}`, long)))
	if err != nil || reply.Header.Get(micro.ErrorCodeHeader) != wire.CodeBadRequest {
		t.Errorf("plan: %v", err)
	}
	c, err := client.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	if w, err := c.Lookup(ctx, "default", "train", 0); err != nil || w.NodeID != "n1" {
		t.Errorf("the next lookup: %+v, %v", w, err)
	}
	if !h.nc.IsConnected() || h.nc.Stats().Reconnects > 0 {
		t.Errorf("connection: connected %v, %d reconnects, last error %v", h.nc.IsConnected(), h.nc.Stats().Reconnects, h.nc.LastError())
	}
}

// TestConflictLines: each node refused GPUs gets one problem line per
// holder, naming a UUID and counting the others; a rogue listing many
// nodes' GPUs gets at most maxConflictLines lines, the last counting
// the rest; a conflict ended clears its line.
func TestConflictLines(t *testing.T) {
	p := drive(New(Config{Log: zerolog.Nop()}))
	for i := range 12 {
		id := fmt.Sprintf("h%02d", i)
		if _, err := p.live.put(id, claimant(id, nil)); err != nil {
			t.Fatal(err)
		}
	}
	two := claimant("r1", map[int]string{0: "h00:0", 1: "h00:1"})
	if _, err := p.live.put("r1", two); err != nil {
		t.Fatal(err)
	}
	keys := p.sayConflicts(nil)
	first := min(inventory.SimulatedUUID("h00", 0), inventory.SimulatedUUID("h00", 1))
	if want := []string{"GPU UUID conflict: " + first + " and 1 more held by node h00, listed by node r1 too: refused to r1"}; !slices.Equal(p.problemList(), want) {
		t.Fatalf("problems %q, want %q", p.problemList(), want)
	}
	steal := map[int]string{}
	for i := range 8 {
		steal[i] = fmt.Sprintf("h%02d:0", i+1)
	}
	if _, err := p.live.put("r2", claimant("r2", steal)); err != nil {
		t.Fatal(err)
	}
	keys = p.sayConflicts(keys)
	got := p.problemList()
	if len(got) != maxConflictLines || !strings.Contains(got[len(got)-1], "2 more nodes list GPUs other nodes hold") {
		t.Fatalf("%d problems, want %d, the last counting the rest: %q", len(got), maxConflictLines, got)
	}
	p.live.remove("r1")
	p.live.remove("r2")
	if p.sayConflicts(keys); len(p.problemList()) != 0 {
		t.Fatalf("problems after the rogues left: %q", p.problemList())
	}
}

// TestOwnersFromPlans: a planner restarted while a squatter lists a
// node's GPUs learns from the plan it reads back which node held them:
// the squatter, reporting first, holds them only until that node
// reports, which takes them back.
func TestOwnersFromPlans(t *testing.T) {
	p := drive(New(Config{Log: zerolog.Nop()}))
	u := inventory.SimulatedUUID("r2", 0)
	var pl planner.Plan
	pl.Workers = plan.NewWorkers([]plan.Worker{{Component: plan.Train, NodeID: "r2", GPUs: []int{0}, GPUUUIDs: []string{u}}})
	p.learnOwners(&pl)
	if _, err := p.live.put("rg", claimant("rg", map[int]string{0: "r2:0"})); err != nil {
		t.Fatal(err)
	}
	if h := p.live.claims.Holder(u); h != "rg" {
		t.Fatalf("holder %q before r2 reports, want rg", h)
	}
	if _, err := p.live.put("r2", claimant("r2", nil)); err != nil {
		t.Fatal(err)
	}
	if h := p.live.claims.Holder(u); h != "r2" {
		t.Fatalf("holder %q once r2 reports, want r2", h)
	}
	if g := p.live.docs["rg"].GPUs[0]; g.Healthy || !strings.Contains(g.UnhealthyReason, "held by node r2") {
		t.Errorf("the squatter's GPU 0: %+v", g)
	}
}
