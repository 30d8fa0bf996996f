package planner

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/poolplanner/poolplanner/plan"
)

// nvlink_domain values: where a component's workers go among NVLink
// domains (a GB200 NVL72 rack's fabric clique; any node without one is a
// domain of its own).
const (
	DomainAny    = "any"
	DomainPack   = "pack"
	DomainStrict = "strict"
)

// domainOf is the NVLink domain of ns: its Domain, or its own id.
func domainOf(ns *nodeState) string {
	if ns.node.Domain != "" {
		return ns.node.Domain
	}
	return "node:" + ns.node.ID
}

// domainOrder orders src (rank order) for group gi of component
// ci's nvlink_domain: whole domains one after another, the one with room
// for the most of its workers first (so that as few domains as possible
// take them, and neighbouring ranks share one), rank order within each.
// Under strict it keeps only one domain: the one the group's kept workers
// are in, or the first with room for all of them (strictDomain); nodes
// left out are counted with the reason. Without
// nvlink_domain, src is returned as it is.
func (e *engine) domainOrder(src []int32, ci comp, gi int) []int32 {
	c := e.cons[ci][gi]
	if c == nil || c.NVLinkDomain == "" || c.NVLinkDomain == DomainAny {
		return src
	}
	mode := c.NVLinkDomain
	type domain struct {
		id    string
		first int // position of its first node in src
		room  int // workers of the group it could take now
		nodes []int32
	}
	byID := map[string]*domain{}
	var all []*domain
	for pos, at := range src {
		ns := e.table[at]
		id := domainOf(ns)
		d := byID[id]
		if d == nil {
			d = &domain{id: id, first: pos}
			byID[id] = d
			all = append(all, d)
		}
		d.nodes = append(d.nodes, at)
		d.room += e.roomOf(ns, ci, gi)
	}
	slices.SortStableFunc(all, func(a, b *domain) int {
		return cmp.Or(cmp.Compare(b.room, a.room), cmp.Compare(a.first, b.first))
	})
	if mode == DomainStrict {
		want := e.strictDomain(ci, gi)
		reason := strictReason(e.demands[ci].comp)
		out := make([]int32, 0, len(src))
		for _, d := range all {
			if d.id == want {
				out = append(out, d.nodes...)
			} else {
				for _, at := range d.nodes {
					e.exhaust(ci, reason, e.table[at].node.ID)
				}
			}
		}
		return out
	}
	out := make([]int32, 0, len(src))
	for _, d := range all {
		out = append(out, d.nodes...)
	}
	return out
}

// strictReason is why a node is not offered to a strict group.
func strictReason(c plan.Component) string {
	return fmt.Sprintf("nvlink_domain strict: in another NVLink domain than %s's", c)
}

// strictDomain is the one NVLink domain strict group gi of component ci
// keeps to, chosen once a run, when the group is first placed: the
// domain it holds most workers in already (a replan), else the first in
// rank order with room for all its workers still to place, else the one
// with the most room. In manual mode, the domain of the node the pools
// first place it on ("" until then: any).
func (e *engine) strictDomain(ci comp, gi int) string {
	key := group{ci, gi}
	if d, ok := e.strict[key]; ok {
		return d
	}
	d := e.homeDomain(ci, gi)
	if d == "" && e.rules.manual {
		// The pools name the nodes: the group keeps to the domain of the
		// first it is placed on.
		return ""
	}
	if d == "" {
		need := e.demands[ci].groups[gi].WorkerNum
		for _, ns := range e.table {
			if gi < len(ns.gcountOf(ci)) {
				need -= int(ns.gcountOf(ci)[gi])
			}
		}
		room := map[string]int{}
		var order []string
		all := make([]int32, len(e.table))
		for i := range all {
			all[i] = int32(i)
		}
		for _, at := range rankOrder(e.table, all) {
			ns := e.table[at]
			id := domainOf(ns)
			if _, ok := room[id]; !ok {
				order = append(order, id)
			}
			room[id] += e.roomOf(ns, ci, gi)
		}
		for _, id := range order {
			if d == "" || room[id] > room[d] {
				d = id
			}
			if room[id] >= need {
				d = id
				break
			}
		}
	}
	if e.strict == nil {
		e.strict = map[group]string{}
	}
	e.strict[key] = d
	return d
}

// homeDomain is the domain group gi of component ci already holds the
// most workers in (kept by a replan), "" if none.
func (e *engine) homeDomain(ci comp, gi int) string {
	count := map[string]int{}
	best := ""
	for _, ns := range e.table {
		if gi < len(ns.gcountOf(ci)) && ns.gcountOf(ci)[gi] > 0 {
			d := domainOf(ns)
			count[d] += int(ns.gcountOf(ci)[gi])
			if best == "" || count[d] > count[best] || count[d] == count[best] && d < best {
				best = d
			}
		}
	}
	return best
}

// strictSpread names a strict group whose workers span several NVLink
// domains ("" when none does): a replan that kept workers where their
// domains changed, which only planning afresh can mend.
func (e *engine) strictSpread() string {
	for ci := range comp(nComp) {
		for gi, c := range e.cons[ci] {
			if c == nil || c.NVLinkDomain != DomainStrict {
				continue
			}
			seen := ""
			for _, ns := range e.table {
				if gi < len(ns.gcountOf(ci)) && ns.gcountOf(ci)[gi] > 0 {
					if d := domainOf(ns); seen == "" {
						seen = d
					} else if d != seen {
						return string(e.demands[ci].comp)
					}
				}
			}
		}
	}
	return ""
}
