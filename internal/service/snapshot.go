package service

import (
	"maps"
	"slices"
	"time"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
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
	// gen, the view's generation they are of, taken when (by the
	// service's clock).
	nodes []planner.Node
	docs  []inventory.NodeInventory
	gen   uint64
	taken time.Time
	// drains are what is out of placement on purpose (drain.go).
	drains []DrainView
	// grow is since when each GPU has been free as of the last replan
	// (its map is replaced, never changed): a validation grows elastic
	// groups as the next replan would.
	grow growWatch
	// health is the loop's, for Health and the lease.
	health loopHealth
}

// planView is one plan in a snapshot.
type planView struct {
	name     string
	latest   *store.StoredPlan
	spec     *planner.Spec
	removing bool
	// planned: the loop plans it (planState.planned).
	planned bool
	// age orders plans of equal priority in a replan (planState.age).
	age uint64
}

// takeSnapshot is the loop's state now; prev (nil: none) lends the
// inventory when it has not changed since, or, unless fresh, when it
// was taken less than inventoryEvery ago: copying a large inventory at
// every change of a busy one (GPU processes come and go on every node)
// would cost the loop in proportion to the cluster at every event. Only
// the loop's goroutine calls it, or a test driving a Service without its
// loop.
func (p *loopState) takeSnapshot(prev *snapshot, fresh bool) *snapshot {
	sn := &snapshot{plans: make(map[string]planView, len(p.states)), names: slices.Sorted(maps.Keys(p.states))}
	for name, s := range p.states {
		sn.plans[name] = planView{name: name, latest: s.latest, spec: s.spec, removing: s.removing, planned: s.planned(), age: s.age}
	}
	sn.drains = p.drainViews()
	sn.grow = p.grow
	sn.health = p.health
	now := p.clock.Now()
	if prev != nil && (prev.gen == p.live.gen || !fresh && now.Sub(prev.taken) < inventoryEvery) {
		sn.nodes, sn.docs, sn.gen, sn.taken = prev.nodes, prev.docs, prev.gen, prev.taken
		return sn
	}
	sn.nodes, sn.gen, sn.taken = p.live.planNodes(), p.live.gen, now
	sn.docs = p.live.sortedDocs()
	return sn
}

// inventoryEvery bounds how often a busy loop copies the inventory into
// its snapshot: readers see it at most this much behind, and at least
// as of the last replan.
const inventoryEvery = 250 * time.Millisecond

// publishSnapshot publishes the loop's state for the readers; fresh:
// the inventory as it is now (a revision was published or adopted),
// whatever the last copy's age. It reports whether the inventory
// published is behind the view's (the loop publishes again
// inventoryEvery later). Only the loop's goroutine calls it (New, before
// there is one; a test driving a Service without its loop, in its own).
func (p *loopState) publishSnapshot(fresh bool) (behind bool) {
	sn := p.takeSnapshot(p.snap.Load(), fresh)
	p.snap.Store(sn)
	if p.ready != nil && p.health.phase != phaseSyncing && sn.gen == p.live.gen {
		// Past syncing with the inventory as read, not a copy lent
		// from before: validations may answer.
		p.readyOnce.Do(func() { close(p.ready) })
	}
	return sn.gen != p.live.gen
}

// view is the latest snapshot (New publishes the first).
func (p *Service) view() *snapshot { return p.snap.Load() }

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
