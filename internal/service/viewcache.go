package service

import (
	"slices"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// viewCache is what the view made for a generation of it: the planner
// nodes and the documents in id order, each with the ids it was made
// of. A later generation's is made from it and the nodes touched since
// (edits), not read again from the maps: a node leaving 20,000 costs a
// copy of the slices, not 20,000 map lookups twice.
type viewCache struct {
	nodes    []planner.Node
	nodeIDs  []string
	docs     []inventory.NodeInventory
	docIDs   []string
	nodesGen uint64
	docsGen  uint64
	// edits are the nodes touched, by generation, since the older of
	// the two slices' generations.
	edits []edit
}

// edit says that node id changed in generation gen.
type edit struct {
	gen uint64
	id  string
}

// touch begins a generation in which node id's document or planner
// node changes.
func (v *view) touch(id string) {
	v.gen++
	c := &v.cache
	if c.nodes == nil && c.docs == nil {
		return
	}
	// Past this many edits a patch saves little over reading the maps
	// again; nor should a view nobody asks grow its log forever.
	if len(c.edits) >= max(64, len(v.docs)/4) {
		*c = viewCache{}
		return
	}
	c.edits = append(c.edits, edit{gen: v.gen, id: id})
}

// planNodes is the inventory for planning, by id: made once per
// generation, and shared (the replan and the snapshot readers) as it
// is never changed.
func (v *view) planNodes() []planner.Node {
	c := &v.cache
	if c.nodes != nil && c.nodesGen == v.gen {
		return c.nodes
	}
	at := func(id string) planner.Node { return v.nodes[id] }
	var out []planner.Node
	if c.nodes != nil {
		out = patched(c.nodeIDs, c.nodes, v.ids, c.since(c.nodesGen), at)
	} else {
		out = make([]planner.Node, len(v.ids))
		for i, id := range v.ids {
			out[i] = at(id)
		}
	}
	// v.ids changes in place; the cache keeps the ids out was made of.
	c.nodes, c.nodeIDs, c.nodesGen = out, slices.Clone(v.ids), v.gen
	c.trim()
	return out
}

// sortedDocs is every document, by node id: made once per generation,
// and shared as it is never changed.
func (v *view) sortedDocs() []inventory.NodeInventory {
	c := &v.cache
	if c.docs != nil && c.docsGen == v.gen {
		return c.docs
	}
	at := func(id string) inventory.NodeInventory { return v.docs[id] }
	var out []inventory.NodeInventory
	if c.docs != nil {
		out = patched(c.docIDs, c.docs, v.docIDs, c.since(c.docsGen), at)
	} else {
		out = make([]inventory.NodeInventory, len(v.docIDs))
		for i, id := range v.docIDs {
			out[i] = at(id)
		}
	}
	c.docs, c.docIDs, c.docsGen = out, slices.Clone(v.docIDs), v.gen
	c.trim()
	return out
}

// since lists, sorted and once each, the nodes touched after
// generation gen.
func (c *viewCache) since(gen uint64) []string {
	var ids []string
	for _, e := range c.edits {
		if e.gen > gen {
			ids = append(ids, e.id)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// trim drops the edits that every slice made is made past.
func (c *viewCache) trim() {
	var oldest uint64
	switch {
	case c.nodes != nil && c.docs != nil:
		oldest = min(c.nodesGen, c.docsGen)
	case c.nodes != nil:
		oldest = c.nodesGen
	case c.docs != nil:
		oldest = c.docsGen
	default:
		c.edits = nil
		return
	}
	i := 0
	for i < len(c.edits) && c.edits[i].gen <= oldest {
		i++
	}
	c.edits = slices.Delete(c.edits, 0, i)
}

// patched is the slice for ids (sorted) made from old, the slice for
// oldIDs (sorted): an entry of an id not in touched (sorted) is old's,
// the others are read with at.
func patched[T any](oldIDs []string, old []T, ids, touched []string, at func(string) T) []T {
	out := make([]T, len(ids))
	j, k := 0, 0
	for i, id := range ids {
		// The same strings as a rule: == is a pointer comparison then.
		for j < len(oldIDs) && oldIDs[j] != id && oldIDs[j] < id {
			j++ // left since
		}
		for k < len(touched) && touched[k] < id {
			k++
		}
		same := j < len(oldIDs) && oldIDs[j] == id
		if same && (k == len(touched) || touched[k] != id) {
			j++
		}
		if same && (k == len(touched) || touched[k] != id) {
			out[i] = old[j-1]
			continue
		}
		out[i] = at(id)
	}
	return out
}
