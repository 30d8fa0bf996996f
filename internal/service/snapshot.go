package service

import (
	"maps"
	"slices"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// snapshot is the loop's state as request handlers, the GPU map and the
// plans' follow goroutines read it: the loop publishes a new one
// (Service.snap) whenever it goes idle after a change, and never
// changes one it published. A plan's revisions are copy-on-write, so a
// snapshot costs the plans' pointers, and the inventory's nodes only
// when the inventory changed.
type snapshot struct {
	// plans are every plan's state by name; names, sorted.
	plans map[string]planView
	names []string
	// nodes are the live inventory for planning, docs its documents;
	// gen, the view's generation they are of.
	nodes []planner.Node
	docs  []inventory.NodeInventory
	gen   uint64
}

// planView is one plan in a snapshot.
type planView struct {
	name     string
	latest   *bus.StoredPlan
	spec     *planner.Spec
	removing bool
	// planned: the loop plans it (planState.planned).
	planned bool
}

// takeSnapshot is the loop's state now; prev (nil: none) lends the
// inventory when it has not changed since. Only the loop's goroutine
// calls it, or a test driving a Service without its loop.
func (p *Service) takeSnapshot(prev *snapshot) *snapshot {
	sn := &snapshot{plans: make(map[string]planView, len(p.states)), names: slices.Sorted(maps.Keys(p.states))}
	for name, s := range p.states {
		sn.plans[name] = planView{name: name, latest: s.latest, spec: s.spec, removing: s.removing, planned: s.planned()}
	}
	if prev != nil && prev.gen == p.live.gen {
		sn.nodes, sn.docs, sn.gen = prev.nodes, prev.docs, prev.gen
		return sn
	}
	sn.nodes, sn.gen = p.live.planNodes(), p.live.gen
	sn.docs = make([]inventory.NodeInventory, 0, len(p.live.docs))
	for _, id := range slices.Sorted(maps.Keys(p.live.docs)) {
		sn.docs = append(sn.docs, p.live.docs[id])
	}
	return sn
}

// publishSnapshot publishes the loop's state for the readers.
func (p *Service) publishSnapshot() {
	p.snap.Store(p.takeSnapshot(p.snap.Load()))
}

// view is the latest snapshot; before the loop publishes one (a Service
// driven by hand, in tests: nothing else writes its state), the state
// as it is.
func (p *Service) view() *snapshot {
	if sn := p.snap.Load(); sn != nil {
		return sn
	}
	return p.takeSnapshot(nil)
}

// planned are the snapshot's planned plans, by name.
func (sn *snapshot) planned() []planView {
	var out []planView
	for _, n := range sn.names {
		if v := sn.plans[n]; v.planned {
			out = append(out, v)
		}
	}
	return out
}
