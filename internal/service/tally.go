package service

import "github.com/poolplanner/poolplanner/internal/inventory"

// tally is the view's unhealthy and refused GPUs, kept node by node as
// documents are set and removed, so that the inventory gauges cost a
// node's change and not the cluster's (20,000 nodes' GPUs after every
// replan was a tenth of a node leave's time).
//
// A node's refused GPUs depend on who holds their UUIDs, which changes
// only as claims hand a UUID over; every node a handover touches has its
// document set again (view.follow), so counting at set time stays true.
type tally struct {
	unhealthy, conflicts int
	// per is each node's share of the totals.
	per map[string]nodeTally
}

type nodeTally struct{ unhealthy, conflicts int32 }

// count makes doc (marked, as the view holds it) node id's share, its
// UUIDs' holders as claims has them now.
func (t *tally) count(id string, doc inventory.NodeInventory, claims *inventory.Claims) {
	t.drop(id)
	var n nodeTally
	for _, g := range doc.GPUs {
		if g.Healthy {
			continue
		}
		n.unhealthy++
		if h := claims.Holder(g.UUID); h != "" && h != id {
			n.conflicts++
		}
	}
	if n == (nodeTally{}) {
		return
	}
	if t.per == nil {
		t.per = map[string]nodeTally{}
	}
	t.per[id] = n
	t.unhealthy += int(n.unhealthy)
	t.conflicts += int(n.conflicts)
}

// drop takes node id's share out.
func (t *tally) drop(id string) {
	n, ok := t.per[id]
	if !ok {
		return
	}
	delete(t.per, id)
	t.unhealthy -= int(n.unhealthy)
	t.conflicts -= int(n.conflicts)
}
