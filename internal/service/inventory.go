package service

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// view is the live inventory as the planner plans on it: each node's
// document and planner node, and the ids in order. Keeping it
// incrementally makes a replan's inventory cost in proportion to the
// change, not the cluster. The loop's goroutine alone writes it.
type view struct {
	docs  map[string]inventory.NodeInventory
	nodes map[string]planner.Node
	ids   []string // sorted: the nodes with a planner node
	// docIDs are docs' ids, sorted.
	docIDs []string
	// gen counts the changes of docs (a snapshot's inventory is of one).
	gen uint64
	// changed is told each node whose document changes (old, present:
	// its document before), for the plans' change logs.
	changed func(id string, old inventory.NodeInventory, present bool)

	// claims says which node holds each GPU UUID: docs holds each node's
	// document as claims marks it (GPUs another node holds unhealthy),
	// claims each as reported.
	claims inventory.Claims
	// news are the claim outcomes worth a log line, until the planner
	// logs them (logClaims).
	news []inventory.Outcome
	// out are the nodes and GPUs out of placement on purpose (drains,
	// hold-outs: drain.go), applied to each node's planner node.
	out map[string]nodeOut
	// tally counts docs' unhealthy and refused GPUs (inventorySize).
	tally tally
	// cache is planNodes' and sortedDocs', of generation gen.
	cache viewCache
}

// doc is node id's document as this view has it.
func (v *view) doc(id string) (inventory.NodeInventory, bool) {
	d, ok := v.docs[id]
	return d, ok
}

// present lists the nodes in this view.
func (v *view) present() []string {
	out := make([]string, 0, len(v.docs))
	for id := range v.docs {
		out = append(out, id)
	}
	return out
}

func newView() view {
	return view{docs: map[string]inventory.NodeInventory{}, nodes: map[string]planner.Node{}}
}

// put sets node id's document (as reported) and reports whether it
// changed. A GPU whose UUID another node holds is marked unhealthy
// (inventory.Claims); a UUID the document no longer lists passes to the
// next node that claims it, whose document changes too.
func (v *view) put(id string, doc inventory.NodeInventory) (bool, error) {
	old, ok := v.doc(id)
	if ok {
		if was, known := v.claims.Reported(id); known {
			old = was
		}
		if inventory.SameInventory(old, doc) {
			return false, nil
		}
		if inventory.SameExceptProcesses(old, doc) {
			// Processes come and go on every node all the time; no plan
			// depends on them, so nothing is replanned and no change is
			// noted: the stored document just lists them (unplanned use).
			v.docs[id] = withProcesses(v.docs[id], doc)
			v.touch(id)
			return false, nil
		}
	}
	out := v.claims.Put(id, doc)
	err := v.set(id, out.Doc)
	v.follow(out)
	return true, err
}

// withProcesses is d with the GPU processes of from, a document of the
// same node alike but for them.
func withProcesses(d, from inventory.NodeInventory) inventory.NodeInventory {
	gpus := slices.Clone(d.GPUs)
	for i := range gpus {
		if i < len(from.GPUs) {
			gpus[i].Processes = from.GPUs[i].Processes
		}
	}
	d.GPUs = gpus
	return d
}

// remove forgets node id and reports whether it was there.
func (v *view) remove(id string) bool {
	old, ok := v.doc(id)
	if !ok {
		return false
	}
	out := v.claims.Remove(id)
	v.note(id, old, true)
	delete(v.docs, id)
	if i, found := slices.BinarySearch(v.docIDs, id); found {
		v.docIDs = slices.Delete(v.docIDs, i, i+1)
	}
	v.tally.drop(id)
	v.touch(id)
	v.dropNode(id)
	v.follow(out)
	return true
}

// set makes doc (marked) node id's document.
func (v *view) set(id string, doc inventory.NodeInventory) error {
	old, ok := v.doc(id)
	v.note(id, old, ok)
	if !ok {
		i, _ := slices.BinarySearch(v.docIDs, id)
		v.docIDs = slices.Insert(v.docIDs, i, id)
	}
	v.docs[id] = doc
	v.tally.count(id, doc, &v.claims)
	v.touch(id)
	n, err := doc.PlannerNode()
	if err != nil {
		v.dropNode(id)
		return fmt.Errorf("node %s: %w", id, err)
	}
	v.nodes[id] = v.out[id].apply(n)
	if i, found := slices.BinarySearch(v.ids, id); !found {
		v.ids = slices.Insert(v.ids, i, id)
	}
	return nil
}

// note tells changed of a change.
func (v *view) note(id string, old inventory.NodeInventory, present bool) {
	if v.changed != nil {
		v.changed(id, old, present)
	}
}

// follow takes the other documents a claim outcome changed, and keeps
// the outcome to log when there is news in it.
func (v *view) follow(out inventory.Outcome) {
	for _, d := range out.Changed {
		_ = v.set(d.NodeID, d) // each was planned before, as reported
	}
	if len(out.Refused) > 0 || len(out.Handovers) > 0 {
		v.news = append(v.news, inventory.Outcome{Refused: out.Refused, Handovers: out.Handovers})
	}
}

func (v *view) dropNode(id string) {
	delete(v.nodes, id)
	if i, found := slices.BinarySearch(v.ids, id); found {
		v.ids = slices.Delete(v.ids, i, i+1)
	}
}

// changes says what changed since the plan's latest revision, as live
// has it now: "nodes joined: ...; nodes left: ...; GPUs unhealthy: n:3;
// nodes changed: ...".
func (s *planState) changes(live *view) []string {
	var joined, left, sick, changed []string
	for id, old := range s.basis {
		now, ok := live.docs[id]
		switch {
		case old == nil && ok:
			joined = append(joined, id)
		case old != nil && !ok:
			left = append(left, id)
		case old == nil || !ok || inventory.SameInventory(*old, now):
		default:
			was := map[string]bool{}
			for _, g := range old.GPUs {
				was[g.UUID] = g.Healthy
			}
			any := false
			for _, g := range now.GPUs {
				if !g.Healthy && was[g.UUID] {
					sick = append(sick, fmt.Sprintf("%s:%d", id, g.Index))
					any = true
				}
			}
			if !any {
				changed = append(changed, id)
			}
		}
	}
	var parts []string
	for _, l := range []struct {
		what string
		ids  []string
	}{{"nodes joined", joined}, {"nodes left", left}, {"GPUs unhealthy", sick}, {"nodes changed", changed}} {
		if len(l.ids) > 0 {
			sort.Strings(l.ids)
			parts = append(parts, l.what+": "+ellipsis(l.ids, 8))
		}
	}
	return parts
}

func ellipsis(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:n], ", ") + fmt.Sprintf(" and %d more", len(ids)-n)
}

// apply folds one inventory event into the live inventory and reports
// whether it changed anything a plan could depend on. Every event but a
// removal is the node reporting.
func (p *loopState) apply(ev store.Event) bool {
	defer p.logClaims()
	for _, s := range p.states {
		s.heard(ev)
	}
	switch ev.Op {
	case store.Changed, store.Removed:
		delete(p.rejectedNow, ev.NodeID)
	}
	switch ev.Op {
	case store.Changed:
		changed, err := p.live.put(ev.NodeID, ev.Inventory)
		if err != nil {
			p.cfg.Log.Warn().Err(err).Msg("skipping a node whose inventory is malformed")
		}
		return changed
	case store.Removed:
		gone := p.live.remove(ev.NodeID)
		if gone && ev.Reason == store.ReasonExpired {
			p.nodeLost(ev.NodeID) // its reporter died: the node turned unhealthy
		}
		return gone
	case store.Rejected:
		p.rejected(ev)
		return p.live.remove(ev.NodeID)
	}
	return false
}

// heard notes what an inventory event says of its node: it reported,
// or its key ran out (only a key that ran out may be an outage's; one
// its reporter deleted is a node leaving).
func (s *planState) heard(ev store.Event) {
	switch ev.Op {
	case store.Changed, store.Heartbeat, store.Rejected:
		s.reported[ev.NodeID] = true
		if ev.Op != store.Rejected {
			delete(s.expired, ev.NodeID)
		}
	case store.Removed:
		if ev.Reason == store.ReasonDeleted {
			delete(s.expired, ev.NodeID)
		} else {
			s.expired[ev.NodeID] = true
		}
	}
}

// logClaims logs the view's claim news: GPUs refused to a node because
// another holds their UUID, and UUIDs passing on.
func (p *loopState) logClaims() {
	for _, o := range p.live.news {
		p.cfg.Metrics.Claimed(len(o.Refused), len(o.Handovers))
		for _, r := range o.Refused {
			p.cfg.Log.Warn().Str("node", r.Node).Int("gpu_index", r.Index).Str("gpu_uuid", r.UUID).Str("holder", r.Holder).
				Msg("GPU UUID already held by another node: the GPU is refused to this one (first claim wins) and marked unhealthy")
		}
		for _, h := range o.Handovers {
			p.cfg.Log.Info().Str("gpu_uuid", h.UUID).Str("from", h.From).Str("node", h.To).
				Msg("GPU UUID passes to the next node that claims it: its holder let it go")
		}
	}
	clear(p.live.news)
	p.live.news = p.live.news[:0]
	p.saveOwners()
}

// rejected logs and counts a document the watch would not take: once
// per key and reason while the key holds it. A watch delivers each
// change once, but a watch made again (after a reconnect, a stall)
// delivers the key's latest message again: that is no new rejection.
func (p *loopState) rejected(ev store.Event) {
	if why, ok := p.rejectedNow[ev.NodeID]; ok && why == ev.Reason {
		return
	}
	p.rejectedNow[ev.NodeID] = ev.Reason
	p.cfg.Metrics.Rejected(ev.Rejection.String())
	p.cfg.Log.Warn().Str("node", ev.NodeID).Uint64("revision", ev.Revision).Str("reason", ev.Reason).
		Msg("inventory document rejected; the node is out of the plan until it reports a valid one")
}

// replaceNodes swaps in a resynced inventory and reports whether it
// differs.
func (p *loopState) replaceNodes(nodes map[string]inventory.NodeInventory) bool {
	defer p.logClaims()
	changed := false
	for _, id := range p.live.present() {
		if _, ok := nodes[id]; !ok {
			for _, s := range p.states {
				s.expired[id] = true // gone while the watch was away: why, unknown
			}
			changed = p.live.remove(id) || changed
		}
	}
	// The nodes known keep their claims; new ones claim in id order,
	// so that every planner reading this batch decides alike.
	ids := slices.Sorted(maps.Keys(nodes))
	known := func(id string) bool { _, ok := p.live.doc(id); return ok }
	ids = append(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !known(id) }),
		slices.DeleteFunc(ids, known)...)
	for _, id := range ids {
		for _, s := range p.states {
			s.reported[id] = true
		}
		c, err := p.live.put(id, nodes[id])
		if err != nil {
			p.cfg.Log.Warn().Err(err).Msg("skipping a node whose inventory is malformed")
		}
		changed = changed || c
	}
	return changed
}

// node is node id's document as it reported it: unmarked by the claims
// (a resync takes it for the node's report when only a heartbeat shows).
func (p *loopState) node(id string) (inventory.NodeInventory, bool) {
	n, ok := p.live.doc(id)
	if r, known := p.live.claims.Reported(id); ok && known {
		n = r
	}
	return n, ok
}

// inventorySize is the live inventory's nodes, unhealthy GPUs, and
// GPUs refused because another node holds their UUID: kept as the view
// changes (tally), since the gauges are set after every replan.
func (p *loopState) inventorySize() (nodes, unhealthy, conflicts int) {
	return len(p.live.docs), p.live.tally.unhealthy, p.live.tally.conflicts
}

// maxConflictLines bounds the problems saying GPU UUID conflicts: a
// rogue document listing every node's UUIDs must not swell the lease.
const maxConflictLines = 8

// sayConflicts names each GPU UUID conflict as a problem (planner
// status's PROBLEM lines): per node refused GPUs, and per node holding
// them, one line with the first UUID and how many more; at most
// maxConflictLines lines, the last counting the rest. was are the
// problem keys set before, cleared where the conflict ended; it returns
// those set now.
func (p *loopState) sayConflicts(was []string) []string {
	type pair struct{ node, holder string }
	uuids := map[pair][]string{}
	for id, doc := range p.live.docs {
		for _, g := range doc.GPUs {
			if h := p.live.claims.Holder(g.UUID); !g.Healthy && h != "" && h != id {
				k := pair{id, h}
				uuids[k] = append(uuids[k], g.UUID)
			}
		}
	}
	pairs := slices.SortedFunc(maps.Keys(uuids), func(a, b pair) int {
		return strings.Compare(a.node+"\x00"+a.holder, b.node+"\x00"+b.holder)
	})
	var now []string
	for i, k := range pairs {
		key := "uuid-conflict:" + k.node + ":" + k.holder
		var msg string
		if i == maxConflictLines-1 && len(pairs) > maxConflictLines {
			key, msg = "uuid-conflict:~more", fmt.Sprintf("GPU UUID conflicts: %d more nodes list GPUs other nodes hold, refused to them", len(pairs)-i)
		} else {
			us := slices.Sorted(slices.Values(uuids[k]))
			more := ""
			if len(us) > 1 {
				more = fmt.Sprintf(" and %d more", len(us)-1)
			}
			msg = fmt.Sprintf("GPU UUID conflict: %s%s held by node %s, listed by node %s too: refused to %s", us[0], more, k.holder, k.node, k.node)
		}
		p.problem(key, msg)
		now = append(now, key)
		if i == maxConflictLines-1 {
			break
		}
	}
	for _, k := range was {
		if !slices.Contains(now, k) {
			p.problem(k, "")
		}
	}
	return now
}

// learnOwners tells the claims which node held each GPU UUID a plan
// read back placed workers on, or its unplaced workers ran on last: a
// planner that has not seen the UUID held yet (restarted) gives it back
// to that node should another list it too (inventory.Claims.Own).
func (p *loopState) learnOwners(pl *planner.Plan) {
	if pl == nil {
		return
	}
	for _, w := range pl.Workers.All() {
		for _, u := range w.GPUUUIDs {
			p.live.claims.Own(u, w.NodeID)
		}
	}
	for _, w := range pl.Unplaced {
		for _, u := range w.GPUUUIDs {
			p.live.claims.Own(u, w.NodeID)
		}
	}
}
