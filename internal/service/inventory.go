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
// document and planner node, the ids in order, and, for the nodes that
// changed since the last plan published, their document then. Keeping it
// incrementally makes a replan's inventory cost in proportion to the
// change, not the cluster.
type view struct {
	docs  map[string]inventory.NodeInventory
	nodes map[string]planner.Node
	ids   []string // sorted: the nodes with a planner node
	// basis holds, per node changed since the last published plan, its
	// document then (nil: it was not there).
	basis map[string]*inventory.NodeInventory
	// lead, on the view of a plan planned beside the lead's (a
	// sibling's), is the lead's view: docs then holds only the nodes
	// changed since this plan's last revision (absent: gone), the lead's
	// the others, as they were before the lead took the event (siblings
	// take each event first); no planner nodes. Only the loop's
	// goroutine writes the lead's documents, so it reads them unlocked.
	lead *view

	// claims, on the lead's view, says which node holds each GPU UUID:
	// docs holds each node's document as claims marks it (GPUs another
	// node holds unhealthy), claims each as reported. A sibling's view
	// asks its lead's claims what an event will do (siblings take it
	// first, so the lead's are as they were before it), or, through a
	// resync, scratch: a copy of them that the batch changes.
	claims  inventory.Claims
	scratch *inventory.Claims
	// news are the lead's claim outcomes worth a log line, until the
	// planner logs them (logClaims).
	news []inventory.Outcome
}

// doc is node id's document as this view has it.
func (v *view) doc(id string) (inventory.NodeInventory, bool) {
	if v.lead != nil {
		if _, changed := v.basis[id]; !changed {
			d, ok := v.lead.docs[id]
			return d, ok
		}
	}
	d, ok := v.docs[id]
	return d, ok
}

// present lists the nodes in this view.
func (v *view) present() []string {
	out := make([]string, 0, len(v.docs))
	if v.lead != nil {
		for id := range v.lead.docs {
			if _, changed := v.basis[id]; !changed {
				out = append(out, id)
			}
		}
	}
	for id := range v.docs {
		out = append(out, id)
	}
	return out
}

// settled starts a new change log: the last plan was published.
func (v *view) settled() {
	clear(v.basis)
	if v.lead != nil {
		clear(v.docs) // the lead's are this plan's again
	}
}

func newView() view {
	return view{docs: map[string]inventory.NodeInventory{}, nodes: map[string]planner.Node{}, basis: map[string]*inventory.NodeInventory{}}
}

// put sets node id's document (as reported) and reports whether it
// changed. A GPU whose UUID another node holds is marked unhealthy
// (inventory.Claims); a UUID the document no longer lists passes to the
// next node that claims it, whose document changes too.
func (v *view) put(id string, doc inventory.NodeInventory) (bool, error) {
	old, ok := v.doc(id)
	if ok {
		if was, known := v.claimsOf().Reported(id); known {
			old = was
		}
		if inventory.SameInventory(old, doc) {
			return false, nil
		}
		if inventory.SameExceptProcesses(old, doc) {
			// Processes come and go on every node all the time; no plan
			// depends on them, so nothing is replanned and no change is
			// noted: the stored document just lists them (unplanned use).
			if d, ok := v.docs[id]; ok && v.lead == nil {
				v.docs[id] = withProcesses(d, doc)
			}
			return false, nil
		}
	}
	var out inventory.Outcome
	if c := v.claimsOf(); v.commits() {
		out = c.Put(id, doc)
	} else {
		out = c.PeekPut(id, doc)
	}
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
	var out inventory.Outcome
	if c := v.claimsOf(); v.commits() {
		out = c.Remove(id)
	} else {
		out = c.PeekRemove(id)
	}
	v.remember(id, old, true)
	delete(v.docs, id)
	v.dropNode(id)
	v.follow(out)
	return true
}

// claimsOf is the claims this view's documents follow.
func (v *view) claimsOf() *inventory.Claims {
	switch {
	case v.lead == nil:
		return &v.claims
	case v.scratch != nil:
		return v.scratch
	default:
		return &v.lead.claims
	}
}

// commits says whether this view changes the claims it follows: the
// lead's view its own, a sibling's only its scratch copy.
func (v *view) commits() bool { return v.lead == nil || v.scratch != nil }

// set makes doc (marked) node id's document.
func (v *view) set(id string, doc inventory.NodeInventory) error {
	old, ok := v.doc(id)
	v.remember(id, old, ok)
	v.docs[id] = doc
	if v.lead != nil {
		return nil
	}
	n, err := doc.PlannerNode()
	if err != nil {
		v.dropNode(id)
		return fmt.Errorf("node %s: %w", id, err)
	}
	v.nodes[id] = n
	if i, found := slices.BinarySearch(v.ids, id); !found {
		v.ids = slices.Insert(v.ids, i, id)
	}
	return nil
}

// follow takes the other documents a claim outcome changed, and keeps
// the outcome to log when there is news in it.
func (v *view) follow(out inventory.Outcome) {
	for _, d := range out.Changed {
		_ = v.set(d.NodeID, d) // each was planned before, as reported
	}
	if v.lead == nil && (len(out.Refused) > 0 || len(out.Handovers) > 0) {
		v.news = append(v.news, inventory.Outcome{Refused: out.Refused, Handovers: out.Handovers})
	}
}

// batch runs f, the view taking a batch of changes (a resync): a
// sibling's view follows a scratch copy of its lead's claims through
// it, since each change of the batch depends on the previous ones.
func (v *view) batch(f func()) {
	if v.lead != nil {
		v.scratch = v.lead.claims.Clone()
		defer func() { v.scratch = nil }()
	}
	f()
}

func (v *view) dropNode(id string) {
	delete(v.nodes, id)
	if i, found := slices.BinarySearch(v.ids, id); found {
		v.ids = slices.Delete(v.ids, i, i+1)
	}
}

// remember keeps a node's document as it was at the last published plan,
// the first time it changes after.
func (v *view) remember(id string, old inventory.NodeInventory, present bool) {
	if _, ok := v.basis[id]; ok {
		return
	}
	if present {
		v.basis[id] = &old
	} else {
		v.basis[id] = nil
	}
}

// planNodes is the inventory for planning, by id.
func (v *view) planNodes() []planner.Node {
	out := make([]planner.Node, len(v.ids))
	for i, id := range v.ids {
		out[i] = v.nodes[id]
	}
	return out
}

// changes says what changed since the last published plan: "nodes
// joined: ...; nodes left: ...; GPUs unhealthy: n:3; nodes changed: ...".
func (v *view) changes() []string {
	var joined, left, sick, changed []string
	for id, old := range v.basis {
		now, ok := v.docs[id]
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
func (p *Planner) apply(ev store.Event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Op {
	case store.Changed:
		p.reported[ev.NodeID] = true
		delete(p.expired, ev.NodeID)
		changed, err := p.live.put(ev.NodeID, ev.Inventory)
		if err != nil && p.lead == nil {
			p.cfg.Log.Warn().Err(err).Msg("skipping a node whose inventory is malformed")
		}
		p.logClaims()
		return changed
	case store.Heartbeat:
		p.reported[ev.NodeID] = true
		delete(p.expired, ev.NodeID)
	case store.Removed:
		// Only a key that ran out may be an outage's (outage); one its
		// reporter deleted is a node leaving.
		if ev.Reason == store.ReasonDeleted {
			delete(p.expired, ev.NodeID)
		} else {
			p.expired[ev.NodeID] = true
		}
		defer p.logClaims()
		return p.live.remove(ev.NodeID)
	case store.Rejected:
		p.reported[ev.NodeID] = true
		if p.lead == nil {
			p.rejected(ev)
		}
		defer p.logClaims()
		return p.live.remove(ev.NodeID)
	}
	return false
}

// logClaims logs the view's claim news: GPUs refused to a node because
// another holds their UUID, and UUIDs passing on. p.mu is held.
func (p *Planner) logClaims() {
	for _, o := range p.live.news {
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
}

// rejected logs a document the watch would not take: once per key and
// change, since the watch delivers each change once.
func (p *Planner) rejected(ev store.Event) {
	p.cfg.Log.Warn().Str("node", ev.NodeID).Uint64("revision", ev.Revision).Str("reason", ev.Reason).
		Msg("inventory document rejected; the node is out of the plan until it reports a valid one")
}

// replaceNodes swaps in a resynced inventory and reports whether it
// differs.
func (p *Planner) replaceNodes(nodes map[string]inventory.NodeInventory) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.logClaims()
	changed := false
	p.live.batch(func() {
		for _, id := range p.live.present() {
			if _, ok := nodes[id]; !ok {
				p.expired[id] = true // gone while the watch was away: why, unknown
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
			p.reported[id] = true
			c, err := p.live.put(id, nodes[id])
			if err != nil && p.lead == nil {
				p.cfg.Log.Warn().Err(err).Msg("skipping a node whose inventory is malformed")
			}
			changed = changed || c
		}
	})
	return changed
}

// node is node id's document as it reported it: unmarked by the claims
// (a resync takes it for the node's report when only a heartbeat shows).
func (p *Planner) node(id string) (inventory.NodeInventory, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.live.doc(id)
	if r, known := p.live.claimsOf().Reported(id); ok && known {
		n = r
	}
	return n, ok
}

// inventorySize is the live inventory's nodes and unhealthy GPUs.
func (p *Planner) inventorySize() (nodes, unhealthy int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, doc := range p.live.docs {
		unhealthy += len(doc.GPUs) - len(doc.HealthyGPUs())
	}
	return len(p.live.docs), unhealthy
}

// revision is the latest revision's number (0: none).
func (p *Planner) revision() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest == nil {
		return 0
	}
	return p.latest.Plan.Revision
}
