package service

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// pinnedSpec asks for train workers of one GPU on GPUs 0..workers-1 of
// node (a manual pool).
func pinnedSpec(workers, priority int, node string) string {
	return fmt.Sprintf("priority: %d\nscheduling:\n  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}\nplacement: {mode: manual}\n"+
		"resource_pool:\n  - name: train_pool\n    num_node: 1\n    num_gpus: 8\n    node_ids: [%s]\n    train: \"0-%d\"\n",
		priority, workers, node, workers-1)
}

// fatal is what the stream tests need of a testing.TB or a rapid.T.
type fatal interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// setSpec makes spec plan name's spec on p, a planner driven by hand
// (offline); "" removes it.
func setSpec(t fatal, p *loopState, name, spec string, age uint64) {
	t.Helper()
	s := p.state(name)
	if s == nil {
		if spec == "" {
			return
		}
		s = p.addState(name)
	}
	if spec == "" {
		s.removing = s.spec != nil
		return
	}
	parsed, err := planner.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatalf("spec of %s: %v\n%s", name, err, spec)
	}
	if s.spec == nil || s.removing {
		s.age = age
	}
	s.spec, s.digest, s.specBytes, s.removing = parsed, SpecDigest(parsed), []byte(spec), false
}

// heldOf is what a document holds by GPU UUID (its workers') and by
// node:index (its workers' and its pools').
func heldOf(d *plan.Document) map[string]bool {
	return planner.GPUKeys(&planner.Plan{Document: *d})
}

// streamCheck replays the plan stream from sequence from, for the plans
// named, rebuilding each revision from the stream as the client package
// does; it fails when at any position two plans' latest revisions hold
// one GPU (by UUID or node:index). It returns how many events it read
// and how many were release steps.
func streamCheck(t fatal, js jetstream.JetStream, c *client.Client, from uint64, names []string) (events, releases int) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, client.PlansStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	latest := map[string]*plan.Document{}
	for seq := from; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // a lease that lapsed, a trimmed revision
		}
		name, ok := strings.CutPrefix(m.Subject, client.PlanSubjectPrefix)
		if !ok || !slices.Contains(names, name) {
			continue
		}
		var rev int
		_, _ = fmt.Sscan(m.Header.Get(client.RevisionHeader), &rev)
		r, err := c.Plan(ctx, name, rev)
		if err != nil {
			t.Fatalf("plan %s revision %d at %d: %v", name, rev, seq, err)
		}
		events++
		if strings.HasPrefix(r.Document.Reason, "release step") {
			releases++
		}
		latest[name] = r.Document
		owner := map[string]string{}
		for _, n := range slices.Sorted(maps.Keys(latest)) {
			for k := range heldOf(latest[n]) {
				if o, ok := owner[k]; ok {
					t.Fatalf("at stream sequence %d (plan %s revision %d: %s): GPU %s held by plans %s (revision %d) and %s (revision %d)",
						seq, name, rev, r.Document.Reason, k, o, latest[o].Revision, n, latest[n].Revision)
				}
				owner[k] = n
			}
		}
	}
	return events, releases
}

// runs numbers the property's runs, whose plans are named apart on one
// server.
var runs atomic.Int64

// TestPublishOrderOnStream: three plans on six nodes under random churn
// (specs resized, reprioritised, pinned to nodes by manual pools,
// removed; nodes leaving and coming back; GPUs failing), replanned by
// the service's own replan, which publishes to an embedded server.
// Replaying the plan stream, rebuilding every revision from it, no
// position shows two plans' latest revisions holding one GPU.
func TestPublishOrderOnStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	var events, releases int
	rapid.Check(t, func(rt *rapid.T) {
		run := runs.Add(1)
		names := []string{fmt.Sprintf("r%da", run), fmt.Sprintf("r%db", run), fmt.Sprintf("r%dc", run)}
		p := drive(New(Config{NC: h.nc, JS: h.js, Plan: names[0], Settle: -1, Log: zerolog.Nop()}))
		if _, err := p.start(ctx); err != nil {
			rt.Fatal(err)
		}
		st, _ := h.js.Stream(ctx, client.PlansStream)
		info, _ := st.Info(ctx)
		from := info.State.LastSeq + 1
		docs := map[string]inventory.NodeInventory{}
		var ids []string
		for i := range 6 {
			id := fmt.Sprintf("r%dn%d", run, i)
			var doc inventory.NodeInventory
			_ = json.Unmarshal(simDoc(id), &doc)
			docs[id], ids = doc, append(ids, id)
			_, _ = p.live.put(id, doc)
		}
		age := uint64(0)
		for range rapid.IntRange(1, 10).Draw(rt, "steps") {
			for range rapid.IntRange(1, 3).Draw(rt, "changes") {
				age++
				name := rapid.SampledFrom(names).Draw(rt, "plan")
				prio := rapid.IntRange(0, 2).Draw(rt, "priority")
				switch rapid.IntRange(0, 5).Draw(rt, "change") {
				case 0, 1:
					setSpec(rt, p, name, shareSpec(rapid.IntRange(1, 24).Draw(rt, "workers"), prio), age)
				case 2, 3:
					node := rapid.SampledFrom(ids).Draw(rt, "pinned")
					setSpec(rt, p, name, pinnedSpec(rapid.IntRange(1, 8).Draw(rt, "workers"), prio, node), age)
				case 4:
					setSpec(rt, p, name, "", age)
				default:
					id := rapid.SampledFrom(ids).Draw(rt, "node")
					switch rapid.IntRange(0, 2).Draw(rt, "inventory") {
					case 0:
						p.live.remove(id)
					case 1:
						_, _ = p.live.put(id, docs[id])
					default:
						var sick inventory.NodeInventory
						_ = json.Unmarshal(simDoc(id, rapid.IntRange(0, 7).Draw(rt, "sick")), &sick)
						_, _ = p.live.put(id, sick)
					}
				}
			}
			if err := p.replan(ctx); err != nil {
				rt.Fatal(err)
			}
		}
		e, r := streamCheck(rt, h.js, wireClient(p), from, names)
		events, releases = events+e, releases+r
	})
	t.Logf("%d revisions replayed, %d of them release steps", events, releases)
}

// TestSwapPublishesReleaseStep: two plans pinned to a node each swap
// nodes in one replan (a planner restarted on both new specs). The
// higher one cannot take its new node before the other gives it up,
// nor the other: one of them publishes a release step first, and the
// stream never shows a GPU in both plans' latest revisions.
func TestSwapPublishesReleaseStep(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"a": pinnedSpec(4, 1, "n1"), "b": pinnedSpec(4, 0, "n2")})
	cfg := Config{Debounce: 20 * time.Millisecond, Settle: -1}
	stop := h.plannerWith(ctx, cfg)
	valid := func(p *planner.Plan) bool { return p.Valid() }
	a1, b1 := h.waitFor("a", "valid", valid), h.waitFor("b", "valid", valid)
	stop()
	for name, node := range map[string]string{"a": "n2", "b": "n1"} {
		spec := pinnedSpec(4, 1, node)
		if name == "b" {
			spec = pinnedSpec(4, 0, node)
		}
		if _, err := specs.Put(ctx, name, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	stop = h.plannerWith(ctx, cfg)
	defer stop()
	onNode := func(node string) func(*planner.Plan) bool {
		return func(p *planner.Plan) bool { return p.Valid() && p.Workers.Len() == 4 && p.Workers.At(0).NodeID == node }
	}
	a2, b2 := h.waitFor("a", "on n2", onNode("n2")), h.waitFor("b", "on n1", onNode("n1"))
	if a2.Revision+b2.Revision != a1.Revision+b1.Revision+3 {
		t.Errorf("revisions a %d→%d, b %d→%d: want one release step and two new revisions", a1.Revision, a2.Revision, b1.Revision, b2.Revision)
	}
	events, releases := streamCheck(t, h.js, store.NewPlanStore(h.js).Client(), 1, []string{"a", "b"})
	if releases != 1 {
		t.Errorf("%d events, %d release steps; want 1", events, releases)
	}
}
