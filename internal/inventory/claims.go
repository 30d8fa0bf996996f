package inventory

import (
	"fmt"
	"maps"
	"slices"
	"sort"
)

// Claims decides which node may use each GPU UUID: one GPU, one node.
// A UUID is held by the first live node whose document lists it (its
// claim); a later document of another node listing it keeps its other
// GPUs, but the claimed ones are marked unhealthy, with a reason naming
// the holder, so that the planner never places work on one device from
// two nodes and its reasons ("GPU unhealthy") show where they went.
// When the holder lets a UUID go (it leaves, or its document stops
// listing it) the UUID passes at once to the earliest claimant still
// listing it, whose document is marked again: the planner replans on
// that as on any change. Which node claimed first is the order of
// Put calls; a planner that reads a whole bucket at once puts the nodes
// it already had first, then the new ones by id.
//
// A UUID's history decides before claim order: the first node that
// ever held it (its owner, as far as these claims go back, or as Own
// said from a plan read back) takes it back whenever it lists it, from
// whichever node holds it then. So a node that listed another's GPUs
// while that one was away (a rogue reporter putting its document)
// holds them only until the node whose GPUs they are returns.
//
// An owner this process inferred (a first holder, or Own) is unsaved
// until TakeUnsaved hands it on, for the planner to persist; one Owned
// names (read back from where the planner persisted them) decides over
// whatever this process inferred, so that every planner, started at any
// time, agrees on the owner.
//
// GPUs with an empty UUID are not indexed (Validate refuses them in
// documents). The zero value is empty and ready; not safe for
// concurrent use.
type Claims struct {
	// holder is, per UUID, the node that holds it; waiting, per UUID
	// held, the other nodes listing it, in the order they claimed it.
	holder  map[string]string
	waiting map[string][]string
	// owner is, per UUID, the first node that held it (or Own named):
	// kept while the UUID is out of use, forgotten only when too many
	// UUIDs nobody lists are remembered (maxIdleOwners).
	owner map[string]string
	// unsaved are the owners inferred here (a subset of owner) that
	// TakeUnsaved has not handed on yet; persisted, the UUIDs whose
	// owner Owned named, which are never forgotten (the store bounds
	// them).
	unsaved   map[string]string
	persisted map[string]bool
	// docs is every node's document as it reported it.
	docs map[string]NodeInventory
}

// Refused is a GPU of a node's document that another node holds.
type Refused struct {
	Node   string
	Index  int
	UUID   string
	Holder string
}

// Handover is a UUID passing from a node that let it go to the next
// claimant.
type Handover struct {
	UUID, From, To string
}

// Outcome is what one document, or one node leaving, does.
type Outcome struct {
	// Doc is the document as the planner must take it: GPUs another
	// node holds marked unhealthy (Put only).
	Doc NodeInventory
	// Refused lists Doc's GPUs another node holds.
	Refused []Refused
	// Handovers are the UUIDs the node let go that another claims.
	Handovers []Handover
	// Changed are other nodes' documents marked again because of the
	// handovers, by node id: the new holders', and those of claimants
	// still waiting, whose reason names the new holder.
	Changed []NodeInventory
}

// ClaimedReason is the unhealthy_reason of a GPU whose UUID node holder
// holds.
func ClaimedReason(uuid, holder string) string {
	return fmt.Sprintf("GPU UUID %s is held by node %s, which reported it first; one GPU, one node", uuid, holder)
}

// Put records doc as node id's document and returns it marked, and the
// other documents that changed with it.
func (c *Claims) Put(id string, doc NodeInventory) Outcome {
	out := c.outcome(id, &doc)
	c.commit(id, &doc)
	return out
}

// Remove forgets node id (it left): its UUIDs pass on.
func (c *Claims) Remove(id string) Outcome {
	out := c.outcome(id, nil)
	c.commit(id, nil)
	return out
}

// PeekPut is what Put would return, changing nothing.
func (c *Claims) PeekPut(id string, doc NodeInventory) Outcome { return c.outcome(id, &doc) }

// PeekRemove is what Remove would return, changing nothing.
func (c *Claims) PeekRemove(id string) Outcome { return c.outcome(id, nil) }

// Reported is node id's document as it reported it (unmarked).
func (c *Claims) Reported(id string) (NodeInventory, bool) {
	d, ok := c.docs[id]
	return d, ok
}

// Holder is the node that holds uuid ("": none).
func (c *Claims) Holder(uuid string) string { return c.holder[uuid] }

// Owner is the node whose history holds uuid ("": none known).
func (c *Claims) Owner(uuid string) string { return c.owner[uuid] }

// Own names node the owner of uuid, where none is known: what a plan
// read back says held it, for a planner that has not seen it held.
// The next document listing it decides by it; a holder now keeps it
// until then.
func (c *Claims) Own(uuid, node string) {
	if uuid == "" || node == "" || c.owner[uuid] != "" {
		return
	}
	if c.owner == nil {
		c.owner = map[string]string{}
	}
	if c.unsaved == nil {
		c.unsaved = map[string]string{}
	}
	c.owner[uuid], c.unsaved[uuid] = node, node
}

// Owned names node the owner of uuid as persisted: over whatever this
// process inferred. Like Own, the next document listing it decides by
// it; a holder now keeps it until then.
func (c *Claims) Owned(uuid, node string) {
	if uuid == "" || node == "" {
		return
	}
	if c.owner == nil {
		c.owner = map[string]string{}
	}
	if c.persisted == nil {
		c.persisted = map[string]bool{}
	}
	c.owner[uuid], c.persisted[uuid] = node, true
	delete(c.unsaved, uuid)
	if len(c.unsaved) == 0 {
		// Dropped once empty, as TakeUnsaved drops it: a restarted
		// planner infers every UUID's owner from the plan it read back
		// (Own) and then reads them all persisted, and the emptied map
		// kept its buckets, 10.5 MB at 160,000 UUIDs, for good.
		c.unsaved = nil
	}
}

// TakeUnsaved returns, per node, the UUIDs it owns that this process
// inferred and has not handed on before, sorted, and forgets them: the
// caller persists them (and hands back with Own any it could not).
func (c *Claims) TakeUnsaved() map[string][]string {
	if len(c.unsaved) == 0 {
		return nil
	}
	out := map[string][]string{}
	for u, n := range c.unsaved {
		out[n] = append(out[n], u)
	}
	for _, us := range out {
		slices.Sort(us)
	}
	// Dropped, not cleared: a cleared map keeps its buckets, some 10 MB
	// once a first start at 20,000 nodes inferred every UUID's owner.
	c.unsaved = nil
	return out
}

// Owners returns, per node, every UUID it owns (persisted or inferred),
// sorted: what a planner puts back in a bucket that was lost.
func (c *Claims) Owners() map[string][]string {
	if len(c.owner) == 0 {
		return nil
	}
	out := map[string][]string{}
	for u, n := range c.owner {
		out[n] = append(out[n], u)
	}
	for _, us := range out {
		slices.Sort(us)
	}
	return out
}

// maxIdleOwners bounds the owners remembered of UUIDs nobody holds: a
// reporter inventing UUIDs must not grow the claims for ever.
const maxIdleOwners = 4096

// Clone is an independent copy of c.
func (c *Claims) Clone() *Claims {
	out := &Claims{holder: maps.Clone(c.holder), docs: maps.Clone(c.docs), owner: maps.Clone(c.owner), unsaved: maps.Clone(c.unsaved), persisted: maps.Clone(c.persisted),
		waiting: make(map[string][]string, len(c.waiting))}
	for u, w := range c.waiting {
		out.waiting[u] = slices.Clone(w)
	}
	return out
}

// lists reports whether doc lists uuid (nil: a node leaving lists none).
func lists(doc *NodeInventory, uuid string) bool {
	return doc != nil && slices.ContainsFunc(doc.GPUs, func(g GPU) bool { return g.UUID == uuid })
}

// holderAfter is who holds uuid once node id's document is doc.
func (c *Claims) holderAfter(id string, doc *NodeInventory, uuid string) string {
	h, ok := c.holder[uuid]
	switch {
	case !ok && lists(doc, uuid):
		return id
	case !ok:
		return ""
	case h != id && lists(doc, uuid) && c.owner[uuid] == id:
		return id // its owner takes it back
	case h != id || lists(doc, uuid):
		return h
	}
	return c.next(uuid)
}

// next is who takes uuid when its holder lets it go: the earliest
// claimant ("": none). (Its owner never waits: listing it, it holds it.)
func (c *Claims) next(uuid string) string {
	if w := c.waiting[uuid]; len(w) > 0 {
		return w[0]
	}
	return ""
}

// outcome computes what putting doc as id's document (nil: id leaving)
// does, from c as it is.
func (c *Claims) outcome(id string, doc *NodeInventory) Outcome {
	var out Outcome
	holder := func(uuid string) string { return c.holderAfter(id, doc, uuid) }
	if doc != nil {
		out.Doc, out.Refused = mark(id, *doc, holder)
	}
	var touched []string
	handed := func(u string) bool {
		return slices.ContainsFunc(out.Handovers, func(h Handover) bool { return h.UUID == u })
	}
	for _, g := range c.docs[id].GPUs {
		u := g.UUID
		if u == "" || c.holder[u] != id || lists(doc, u) || len(c.waiting[u]) == 0 || handed(u) {
			continue
		}
		out.Handovers = append(out.Handovers, Handover{UUID: u, From: id, To: c.next(u)})
		touched = append(touched, c.waiting[u]...)
	}
	if doc != nil {
		// Its owner back: the UUIDs it takes back from their holders.
		for _, g := range doc.GPUs {
			u := g.UUID
			if h, ok := c.holder[u]; !ok || h == id || c.owner[u] != id || handed(u) {
				continue
			}
			out.Handovers = append(out.Handovers, Handover{UUID: u, From: c.holder[u], To: id})
			touched = append(touched, c.holder[u])
			touched = append(touched, slices.DeleteFunc(slices.Clone(c.waiting[u]), func(n string) bool { return n == id })...)
		}
	}
	sort.Strings(touched)
	for _, n := range slices.Compact(touched) {
		d, _ := mark(n, c.docs[n], holder)
		out.Changed = append(out.Changed, d)
	}
	return out
}

// mark is node id's doc with the GPUs another node holds marked
// unhealthy, and those GPUs.
func mark(id string, doc NodeInventory, holder func(string) string) (NodeInventory, []Refused) {
	var refused []Refused
	for i, g := range doc.GPUs {
		if g.UUID == "" {
			continue
		}
		h := holder(g.UUID)
		if h == id || h == "" {
			continue
		}
		if refused == nil {
			doc.GPUs = slices.Clone(doc.GPUs)
		}
		refused = append(refused, Refused{Node: id, Index: g.Index, UUID: g.UUID, Holder: h})
		reason := ClaimedReason(g.UUID, h)
		if !g.Healthy && g.UnhealthyReason != "" {
			reason += "; also " + g.UnhealthyReason
		}
		doc.GPUs[i].Healthy, doc.GPUs[i].UnhealthyReason = false, reason
	}
	return doc, refused
}

// commit makes doc node id's document (nil: id left).
func (c *Claims) commit(id string, doc *NodeInventory) {
	if c.holder == nil {
		c.holder = map[string]string{}
	}
	if c.waiting == nil {
		c.waiting = map[string][]string{}
	}
	if c.docs == nil {
		c.docs = map[string]NodeInventory{}
	}
	for _, g := range c.docs[id].GPUs {
		u := g.UUID
		if u == "" || lists(doc, u) {
			continue
		}
		w := c.waiting[u]
		switch {
		case c.holder[u] == id && len(w) > 0:
			n := c.next(u)
			c.holder[u] = n
			c.setWaiting(u, slices.DeleteFunc(slices.Clone(w), func(x string) bool { return x == n }))
		case c.holder[u] == id:
			delete(c.holder, u)
		default:
			if i := slices.Index(w, id); i >= 0 {
				c.setWaiting(u, slices.Delete(slices.Clone(w), i, i+1))
			}
		}
	}
	if doc == nil {
		delete(c.docs, id)
		return
	}
	for _, g := range doc.GPUs {
		u := g.UUID
		if u == "" {
			continue
		}
		switch h, ok := c.holder[u]; {
		case !ok:
			c.holder[u] = id
			c.Own(u, id)
		case h != id && c.owner[u] == id:
			// Back, it takes its GPU back; the holder, which still
			// lists it, waits first.
			w := slices.DeleteFunc(slices.Clone(c.waiting[u]), func(x string) bool { return x == id })
			c.holder[u] = id
			c.setWaiting(u, append([]string{h}, w...))
		case h != id && !slices.Contains(c.waiting[u], id):
			c.waiting[u] = append(c.waiting[u], id)
		}
	}
	c.docs[id] = *doc
	if len(c.owner) > len(c.holder)+len(c.persisted)+maxIdleOwners {
		// Forget the owners of the UUIDs nobody holds: every planner
		// reading the same inventory forgets alike. Persisted ones
		// stay: a planner starts with every node's, held or not.
		maps.DeleteFunc(c.owner, func(u, _ string) bool { _, held := c.holder[u]; return !held && !c.persisted[u] })
		maps.DeleteFunc(c.unsaved, func(u, _ string) bool { _, owned := c.owner[u]; return !owned })
	}
}

func (c *Claims) setWaiting(uuid string, w []string) {
	if len(w) == 0 {
		delete(c.waiting, uuid)
		return
	}
	c.waiting[uuid] = w
}
