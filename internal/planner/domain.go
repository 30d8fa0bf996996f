package planner

import (
	"cmp"
	"fmt"
	"slices"
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

// domainMode is component ci's nvlink_domain and the group it was set on
// ("" when none).
func (e *engine) domainMode(ci int) (string, int) {
	for gi, c := range e.cons[ci] {
		if c != nil && c.NVLinkDomain != "" && c.NVLinkDomain != DomainAny {
			return c.NVLinkDomain, gi
		}
	}
	return "", -1
}

// domainOrder orders src (rank order) for component ci's nvlink_domain:
// whole domains one after another, the one with room for the most of its
// workers first (so that as few domains as possible take them, and
// neighbouring ranks share one), rank order within each. Under strict it
// keeps only one domain: the one the component's kept workers are in, or
// the first with room for all of them; nodes left out are counted with
// the reason. Without nvlink_domain, src is returned as it is.
func (e *engine) domainOrder(src []int32, ci int) []int32 {
	mode, gi := e.domainMode(ci)
	if mode == "" {
		return src
	}
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
	if mode == DomainStrict && len(all) > 0 {
		chosen := all[0]
		need := e.demands[ci].left()
		if home := e.homeDomain(ci); home != "" && byID[home] != nil {
			chosen = byID[home]
		} else {
			for _, d := range all {
				if d.room >= need {
					chosen = d
					break
				}
			}
		}
		reason := fmt.Sprintf("nvlink_domain strict: in another NVLink domain than %s's", e.demands[ci].comp)
		for _, d := range all {
			if d != chosen {
				for _, at := range d.nodes {
					e.passedBy(ci, reason, e.table[at].node.ID)
				}
			}
		}
		return chosen.nodes
	}
	out := make([]int32, 0, len(src))
	for _, d := range all {
		out = append(out, d.nodes...)
	}
	return out
}

// domainSrc orders src for a pass that places the components comps
// together: by the nvlink_domain of the first of them that is strict (its
// one domain then holds every component of the pass), else of the first
// that packs.
func (e *engine) domainSrc(src []int32, comps ...int) []int32 {
	pick := -1
	for _, ci := range comps {
		switch mode, _ := e.domainMode(ci); {
		case mode == DomainStrict:
			return e.domainOrder(src, ci)
		case mode == DomainPack && pick < 0:
			pick = ci
		}
	}
	if pick < 0 {
		return src
	}
	return e.domainOrder(src, pick)
}

// homeDomain is the domain component ci already holds workers in (kept
// by a replan), "" if none.
func (e *engine) homeDomain(ci int) string {
	for _, ns := range e.table {
		if ns.count[ci] > 0 {
			return domainOf(ns)
		}
	}
	return ""
}

// roomOf is how many workers of group gi of component ci the GPUs of ns
// could take now, by its constraints.
func (e *engine) roomOf(ns *nodeState, ci, gi int) int {
	if gi >= len(e.demands[ci].groups) {
		return 0
	}
	g := e.demands[ci].groups[gi]
	count, frac := gpuCount(g)
	c := e.cons[ci][gi]
	if count == 0 || c.any() && !c.nodeOK(ns.node) {
		return 0
	}
	free := 0
	for _, x := range ns.usable {
		if e.fits(ns, ci, x, 1) && (!c.any() || !c.gpuWise() || c.gpuOK(ns.node, x)) {
			free++
		}
	}
	if count > 1 {
		return free / count
	}
	return free * int((1+eps)/frac)
}
