package inventory

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// claimDoc is node id's document with one healthy GPU per UUID.
func claimDoc(id string, uuids ...string) NodeInventory {
	d := NodeInventory{NodeID: id}
	for i, u := range uuids {
		d.GPUs = append(d.GPUs, GPU{Index: i, UUID: u, Healthy: true})
	}
	return d
}

// usable is, per UUID, the nodes whose marked document may use it.
func usable(docs map[string]NodeInventory) map[string][]string {
	out := map[string][]string{}
	for id, d := range docs {
		for _, g := range d.GPUs {
			if g.Healthy {
				out[g.UUID] = append(out[g.UUID], id)
			}
		}
	}
	return out
}

// TestClaims: the first node to list a UUID holds it; a later one keeps
// its other GPUs, the claimed one unhealthy with a reason naming the
// holder; the UUID passes at once to the earliest claimant still
// listing it when the holder leaves or stops listing it.
func TestClaims(t *testing.T) {
	type step struct {
		put    *NodeInventory // else remove, or own
		remove string
		own    string // "UUID>NODE": Own
		owned  string // "UUID>NODE": Owned (persisted)
		// refused: the put's refused GPUs as "INDEX>HOLDER";
		// handovers as "UUID:FROM>TO"; changed: the nodes re-marked.
		refused, handovers, changed []string
	}
	put := func(id string, uuids ...string) *NodeInventory { d := claimDoc(id, uuids...); return &d }
	for _, c := range []struct {
		name  string
		steps []step
		// holders at the end, UUID → node
		holders map[string]string
	}{
		{name: "no conflict", steps: []step{
			{put: put("a", "u0", "u1")},
			{put: put("b", "u2", "u3")},
		}, holders: map[string]string{"u0": "a", "u1": "a", "u2": "b", "u3": "b"}},
		{name: "second claimant refused", steps: []step{
			{put: put("a", "u0", "u1")},
			{put: put("b", "u1", "u2"), refused: []string{"0>a"}},
		}, holders: map[string]string{"u0": "a", "u1": "a", "u2": "b"}},
		{name: "holder leaves: passes at once", steps: []step{
			{put: put("a", "u0", "u1")},
			{put: put("b", "u2", "u1"), refused: []string{"1>a"}},
			{remove: "a", handovers: []string{"u1:a>b"}, changed: []string{"b"}},
		}, holders: map[string]string{"u1": "b", "u2": "b"}},
		{name: "holder stops listing it", steps: []step{
			{put: put("a", "u0", "u1")},
			{put: put("b", "u1"), refused: []string{"0>a"}},
			{put: put("a", "u0"), handovers: []string{"u1:a>b"}, changed: []string{"b"}},
		}, holders: map[string]string{"u0": "a", "u1": "b"}},
		{name: "its owner takes it back: a squatter loses", steps: []step{
			{put: put("r2", "u0", "u1")},
			{remove: "r2"},
			// rg puts r2's document while r2 is away: it holds them.
			{put: put("rg", "u0", "u1")},
			{put: put("r2", "u0", "u1"), handovers: []string{"u0:rg>r2", "u1:rg>r2"}, changed: []string{"rg"}},
			// rg keeps listing them: refused, and r2 keeps them.
			{put: put("rg", "u0", "u1", "u9"), refused: []string{"0>r2", "1>r2"}},
		}, holders: map[string]string{"u0": "r2", "u1": "r2", "u9": "rg"}},
		{name: "its owner back after a handover", steps: []step{
			{put: put("a", "u0")},
			{put: put("b", "u0"), refused: []string{"0>a"}},
			{remove: "a", handovers: []string{"u0:a>b"}, changed: []string{"b"}},
			{put: put("a", "u0"), handovers: []string{"u0:b>a"}, changed: []string{"b"}},
			// b, still listing it, waits first.
			{put: put("c", "u0"), refused: []string{"0>a"}},
			{remove: "a", handovers: []string{"u0:a>b"}, changed: []string{"b", "c"}},
		}, holders: map[string]string{"u0": "b"}},
		{name: "its owner back takes it from a later holder", steps: []step{
			{put: put("a", "u0")},
			{remove: "a"},
			{put: put("b", "u0")},
			{put: put("c", "u0"), refused: []string{"0>b"}},
			// a is back, and takes it from b; c waits behind b.
			{put: put("a", "u0"), handovers: []string{"u0:b>a"}, changed: []string{"b", "c"}},
		}, holders: map[string]string{"u0": "a"}},
		{name: "a plan read back names the owner", steps: []step{
			{own: "u0>r2"},
			{put: put("rg", "u0")},
			{put: put("r2", "u0"), handovers: []string{"u0:rg>r2"}, changed: []string{"rg"}},
		}, holders: map[string]string{"u0": "r2"}},
		{name: "a persisted owner decides over an inferred one", steps: []step{
			// A planner started while rg squats: rg holds, and looks
			// like the owner, until the persisted one is read.
			{put: put("rg", "u0", "u1")},
			{owned: "u0>r2"},
			{owned: "u1>r2"},
			{put: put("r2", "u0", "u1"), handovers: []string{"u0:rg>r2", "u1:rg>r2"}, changed: []string{"rg"}},
		}, holders: map[string]string{"u0": "r2", "u1": "r2"}},
		{name: "a persisted owner read first: the squatter never owns", steps: []step{
			{owned: "u0>r2"},
			{put: put("rg", "u0")},
			{remove: "rg"},
			{put: put("rg", "u0")},
			{put: put("r2", "u0"), handovers: []string{"u0:rg>r2"}, changed: []string{"rg"}},
		}, holders: map[string]string{"u0": "r2"}},
		{name: "claim order among waiters", steps: []step{
			{put: put("a", "u0")},
			{put: put("c", "u0"), refused: []string{"0>a"}},
			{put: put("b", "u0"), refused: []string{"0>a"}},
			// c claimed before b; b's reason now names c.
			{remove: "a", handovers: []string{"u0:a>c"}, changed: []string{"b", "c"}},
			{remove: "c", handovers: []string{"u0:c>b"}, changed: []string{"b"}},
		}, holders: map[string]string{"u0": "b"}},
		{name: "a waiter leaving changes nothing", steps: []step{
			{put: put("a", "u0")},
			{put: put("b", "u0"), refused: []string{"0>a"}},
			{remove: "b"},
		}, holders: map[string]string{"u0": "a"}},
		{name: "a waiter's new document keeps its place", steps: []step{
			{put: put("a", "u0")},
			{put: put("b", "u0"), refused: []string{"0>a"}},
			{put: put("c", "u0"), refused: []string{"0>a"}},
			{put: put("b", "u0", "u9"), refused: []string{"0>a"}},
			{remove: "a", handovers: []string{"u0:a>b"}, changed: []string{"b", "c"}},
		}, holders: map[string]string{"u0": "b", "u9": "b"}},
		{name: "nobody waiting: released", steps: []step{
			{put: put("a", "u0")},
			{remove: "a"},
			{put: put("b", "u0")},
		}, holders: map[string]string{"u0": "b"}},
		{name: "empty UUIDs are not indexed", steps: []step{
			{put: put("a", "")},
			{put: put("b", "")},
		}, holders: map[string]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var claims Claims
			docs := map[string]NodeInventory{}
			for i, s := range c.steps {
				var out Outcome
				if s.own != "" {
					u, n, _ := strings.Cut(s.own, ">")
					claims.Own(u, n)
					continue
				}
				if s.owned != "" {
					u, n, _ := strings.Cut(s.owned, ">")
					claims.Owned(u, n)
					continue
				}
				if s.put != nil {
					peek := claims.PeekPut(s.put.NodeID, *s.put)
					out = claims.Put(s.put.NodeID, *s.put)
					if !reflect.DeepEqual(peek, out) {
						t.Fatalf("step %d: PeekPut %+v, Put %+v", i, peek, out)
					}
					docs[s.put.NodeID] = out.Doc
				} else {
					peek := claims.PeekRemove(s.remove)
					out = claims.Remove(s.remove)
					if !reflect.DeepEqual(peek, out) {
						t.Fatalf("step %d: PeekRemove %+v, Remove %+v", i, peek, out)
					}
					delete(docs, s.remove)
				}
				var refused, handovers, changed []string
				for _, r := range out.Refused {
					refused = append(refused, fmt.Sprintf("%d>%s", r.Index, r.Holder))
					g := out.Doc.GPUs[r.Index]
					if g.Healthy || g.UnhealthyReason != ClaimedReason(r.UUID, r.Holder) {
						t.Errorf("step %d: refused GPU %+v, want unhealthy naming %s", i, g, r.Holder)
					}
				}
				for _, h := range out.Handovers {
					handovers = append(handovers, fmt.Sprintf("%s:%s>%s", h.UUID, h.From, h.To))
				}
				for _, d := range out.Changed {
					changed = append(changed, d.NodeID)
					docs[d.NodeID] = d
				}
				if fmt.Sprint(refused) != fmt.Sprint(s.refused) || fmt.Sprint(handovers) != fmt.Sprint(s.handovers) || fmt.Sprint(changed) != fmt.Sprint(s.changed) {
					t.Errorf("step %d: refused %v handovers %v changed %v; want %v %v %v", i, refused, handovers, changed, s.refused, s.handovers, s.changed)
				}
			}
			for u, nodes := range usable(docs) {
				if u != "" && len(nodes) > 1 {
					t.Errorf("UUID %s usable on %v", u, nodes)
				}
			}
			got := map[string]string{}
			for u, h := range claims.holder {
				got[u] = h
			}
			if !reflect.DeepEqual(got, c.holders) {
				t.Errorf("holders %v, want %v", got, c.holders)
			}
		})
	}
}

// TestTakeUnsaved: the owners this process inferred (first holders, a
// plan read back) are handed on once each, per node; persisted ones
// never.
func TestTakeUnsaved(t *testing.T) {
	var c Claims
	c.Owned("u1", "x") // persisted: a's holding it infers nothing
	c.Put("a", claimDoc("a", "u0", "u1"))
	c.Put("b", claimDoc("b", "u2", "u0"))
	c.Own("u3", "c")
	for i, want := range []map[string][]string{
		{"a": {"u0"}, "b": {"u2"}, "c": {"u3"}},
		nil,
	} {
		if got := c.TakeUnsaved(); !reflect.DeepEqual(got, want) {
			t.Errorf("take %d: %v, want %v", i, got, want)
		}
	}
	c.Put("a", claimDoc("a", "u0", "u1", "u4"))
	c.Owned("u3", "c")
	if got, want := c.TakeUnsaved(), map[string][]string{"a": {"u4"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("after a new GPU: %v, want %v", got, want)
	}
	if got := c.Owner("u1"); got != "x" {
		t.Errorf("owner of u1 %q, want the persisted x", got)
	}
}

// TestOwnedDropsEmptiedUnsaved: a restarted planner's owners, inferred
// from the plan it read back (Own) and then all read persisted (Owned),
// leave no map of unsaved owners behind (an emptied map keeps its
// buckets); those not persisted are still handed on, and owners
// inferred after are too.
func TestOwnedDropsEmptiedUnsaved(t *testing.T) {
	for _, tc := range []struct {
		name      string
		persisted int // of the first 1,000 inferred
		want      map[string][]string
	}{
		{"all persisted", 1000, nil},
		{"one not", 999, map[string][]string{"n124": {"u999"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Claims
			for i := range 1000 {
				c.Own(fmt.Sprint("u", i), fmt.Sprint("n", i/8))
			}
			for i := range tc.persisted {
				c.Owned(fmt.Sprint("u", i), fmt.Sprint("n", i/8))
			}
			if empty := tc.want == nil; empty != (c.unsaved == nil) {
				t.Errorf("unsaved map dropped %v, want %v (%d left)", c.unsaved == nil, empty, len(c.unsaved))
			}
			if got := c.TakeUnsaved(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("unsaved %v, want %v", got, tc.want)
			}
			c.Own("later", "m")
			if got, want := c.TakeUnsaved(), map[string][]string{"m": {"later"}}; !reflect.DeepEqual(got, want) {
				t.Errorf("inferred after: %v, want %v", got, want)
			}
		})
	}
}

// TestPersistedOwnersKept: the owners forgotten to bound memory (a
// reporter inventing UUIDs) are never the persisted ones, however many
// nodes are away.
func TestPersistedOwnersKept(t *testing.T) {
	var c Claims
	const away = maxIdleOwners + 100
	for i := range away {
		c.Owned(fmt.Sprintf("away%d", i), fmt.Sprintf("n%d", i/8))
	}
	for i := range maxIdleOwners + 50 {
		c.Put("rogue", claimDoc("rogue", fmt.Sprintf("made-up%d", i)))
	}
	if got := c.Owner("away0"); got != "n0" {
		t.Errorf("persisted owner of away0 %q, want n0", got)
	}
	if n := len(c.owner); n > away+1+maxIdleOwners {
		t.Errorf("%d owners remembered, want at most %d", n, away+1+maxIdleOwners)
	}
}

// TestClaimedReasonKeepsTheOld: a refused GPU that was unhealthy already
// keeps its own reason after the claim's.
func TestClaimedReasonKeepsTheOld(t *testing.T) {
	var c Claims
	c.Put("a", claimDoc("a", "u0"))
	b := claimDoc("b", "u0")
	b.GPUs[0].Healthy, b.GPUs[0].UnhealthyReason = false, "XID 79"
	got := c.Put("b", b).Doc.GPUs[0].UnhealthyReason
	if want := ClaimedReason("u0", "a") + "; also XID 79"; got != want {
		t.Errorf("reason %q, want %q", got, want)
	}
	if b.GPUs[0].UnhealthyReason != "XID 79" {
		t.Errorf("the document given was changed: %q", b.GPUs[0].UnhealthyReason)
	}
}

// TestClaimsProperties: through any sequence of documents and nodes
// leaving, (1) no UUID is usable on two nodes; (2) each UUID is held by
// the earliest of the nodes listing it now, counting from when each
// began to list it without a break, the holder kept until it lets go;
// the UUID's owner (the first node that held it) taking it back
// whenever it lists it; (3) every live node's document is its report
// marked by the holders;
// (4) Peek answers what Put and Remove do; (5) a clone evolves alike.
func TestClaimsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := []string{"n0", "n1", "n2", "n3"}
		uuids := []string{"u0", "u1", "u2", "u3", "u4"}
		var c Claims
		var clone *Claims
		docs := map[string]NodeInventory{}     // as marked
		reported := map[string]NodeInventory{} // as reported
		holder := map[string]string{}          // the model's
		owner := map[string]string{}           // the model's: first to hold
		since := map[string]map[string]int{}   // node → UUID → step it began listing it
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for step := range steps {
			if step == steps/2 {
				clone = c.Clone()
			}
			id := rapid.SampledFrom(nodes).Draw(t, "node")
			var out Outcome
			if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				peek := c.PeekRemove(id)
				out = c.Remove(id)
				if clone != nil {
					if o := clone.Remove(id); !reflect.DeepEqual(o, out) {
						t.Fatalf("clone: %+v, want %+v", o, out)
					}
				}
				if !reflect.DeepEqual(peek, out) {
					t.Fatalf("PeekRemove %+v, Remove %+v", peek, out)
				}
				delete(docs, id)
				delete(reported, id)
				delete(since, id)
			} else {
				listed := rapid.SliceOfNDistinct(rapid.SampledFrom(uuids), 0, 3, rapid.ID[string]).Draw(t, "uuids")
				d := claimDoc(id, listed...)
				peek := c.PeekPut(id, d)
				out = c.Put(id, d)
				if clone != nil {
					if o := clone.Put(id, d); !reflect.DeepEqual(o, out) {
						t.Fatalf("clone: %+v, want %+v", o, out)
					}
				}
				if !reflect.DeepEqual(peek, out) {
					t.Fatalf("PeekPut %+v, Put %+v", peek, out)
				}
				docs[id], reported[id] = out.Doc, d
				was := since[id]
				since[id] = map[string]int{}
				for _, u := range listed {
					if s, ok := was[u]; ok {
						since[id][u] = s
					} else {
						since[id][u] = step
					}
				}
			}
			for _, d := range out.Changed {
				docs[d.NodeID] = d
			}
			// The model: its owner holds a UUID it lists; else a holder
			// keeps it while it lists it; else the earliest lister takes
			// it (ties: never, one node a step).
			for _, u := range uuids {
				if o, ok := owner[u]; ok {
					if _, lists := since[o][u]; lists {
						holder[u] = o
						continue
					}
				}
				if h, ok := holder[u]; ok {
					if _, still := since[h][u]; still {
						continue
					}
				}
				delete(holder, u)
				best := -1
				for _, n := range nodes {
					if s, ok := since[n][u]; ok && (best < 0 || s < best) {
						best, holder[u] = s, n
					}
				}
				if h, ok := holder[u]; ok && owner[u] == "" {
					owner[u] = h
				}
			}
			for u, ns := range usable(docs) {
				if len(ns) > 1 {
					t.Fatalf("step %d: UUID %s usable on %v", step, u, ns)
				}
			}
			for _, u := range uuids {
				if got := c.Holder(u); got != holder[u] {
					t.Fatalf("step %d: %s held by %q, want %q", step, u, got, holder[u])
				}
			}
			for n, r := range reported {
				want, _ := mark(n, r, c.Holder)
				if !reflect.DeepEqual(docs[n], want) {
					t.Fatalf("step %d: node %s's document %+v, want %+v", step, n, docs[n], want)
				}
				if got, ok := c.Reported(n); !ok || !reflect.DeepEqual(got, r) {
					t.Fatalf("step %d: Reported(%s) = %+v, want %+v", step, n, got, r)
				}
			}
		}
	})
}

// TestParseNodesOneGPUOneNode: offline, a list of documents in which
// two list one GPU UUID, or a GPU with none, is refused, naming both.
func TestParseNodesOneGPUOneNode(t *testing.T) {
	sim, _ := ParseSimulation("2xH100")
	doc := func(id string) NodeInventory {
		d := Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 8}.Inventory()
		d.GPUs = SimulatedGPUs(id, sim)
		return d
	}
	list := func(docs ...NodeInventory) []byte {
		var parts []string
		for _, d := range docs {
			b, _ := json.Marshal(d)
			parts = append(parts, string(b))
		}
		return []byte("[" + strings.Join(parts, ",") + "]")
	}
	a, b := doc("a"), doc("b")
	stolen := doc("b")
	stolen.GPUs[1].UUID = a.GPUs[0].UUID
	noUUID := doc("b")
	noUUID.GPUs[0].UUID = ""
	for _, c := range []struct {
		name string
		data []byte
		want string // "" valid
	}{
		{"distinct", list(a, b), ""},
		{"a UUID twice", list(a, stolen), fmt.Sprintf(`inventory[1].gpus: GPU 1's uuid %q is node a's too, listed before`, a.GPUs[0].UUID)},
		{"no UUID", list(a, noUUID), "inventory[1].gpus[0].uuid: missing"},
		{"cluster info has no UUIDs", []byte(`{"node_id_to_resources": {"ray-1": {"ip": "10.0.0.1", "CPU": 8, "GPU": 2}}}`), ""},
		{"cluster info node id", []byte(`{"node_id_to_resources": {"ray 1": {"ip": "10.0.0.1", "CPU": 8, "GPU": 2}}}`),
			`inventory.node_id_to_resources: invalid node id "ray 1": ' ' at byte 3 is not allowed`},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes, err := ParseNodes(c.data)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("ParseNodes: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("ParseNodes: %v, want %q", err, c.want)
			case c.want == "" && slices.ContainsFunc(nodes, func(n planner.Node) bool { return len(n.Unhealthy) > 0 }):
				t.Fatalf("unhealthy GPUs in %+v", nodes)
			}
		})
	}
}

// TestPersistedOwnersAgree: a planner (Claims) started at any step,
// given the owners another one persisted so far (TakeUnsaved, first
// record wins) and the live documents in any order, agrees with it on
// every UUID's owner from then on, and both give each UUID its owner
// lists to its owner: the squatter that held it when the second one
// started never counts as the owner.
func TestPersistedOwnersAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := []string{"n0", "n1", "n2", "n3"}
		uuids := []string{"u0", "u1", "u2", "u3", "u4"}
		var a Claims
		var b *Claims
		stored := map[string]string{}
		persist := func() {
			for n, us := range a.TakeUnsaved() {
				for _, u := range us {
					if _, ok := stored[u]; !ok {
						stored[u] = n
					}
				}
			}
		}
		live := map[string]NodeInventory{}
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		start := rapid.IntRange(0, steps-1).Draw(t, "start")
		for step := range steps {
			if step == start {
				persist()
				b = &Claims{}
				for u, n := range stored {
					b.Owned(u, n)
				}
				ids := rapid.Permutation(slices.Sorted(maps.Keys(live))).Draw(t, "resync order")
				for _, id := range ids {
					b.Put(id, live[id])
				}
			}
			id := rapid.SampledFrom(nodes).Draw(t, "node")
			if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				a.Remove(id)
				if b != nil {
					b.Remove(id)
				}
				delete(live, id)
			} else {
				d := claimDoc(id, rapid.SliceOfNDistinct(rapid.SampledFrom(uuids), 0, 3, rapid.ID[string]).Draw(t, "uuids")...)
				a.Put(id, d)
				if b != nil {
					b.Put(id, d)
				}
				live[id] = d
			}
			if rapid.Bool().Draw(t, "persist") {
				persist()
			}
			if b == nil {
				continue
			}
			for _, u := range uuids {
				o := a.Owner(u)
				if got := b.Owner(u); got != o {
					t.Fatalf("step %d: UUID %s owned by %q here, %q by the planner started at step %d", step, u, o, got, start)
				}
				if o != "" && lists(ptr(live[o]), u) && (a.Holder(u) != o || b.Holder(u) != o) {
					t.Fatalf("step %d: UUID %s, its owner %s listing it, held by %q and %q", step, u, o, a.Holder(u), b.Holder(u))
				}
			}
		}
	})
}

func ptr[T any](v T) *T { return &v }
