package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Change says how Replan arrived at its plan.
type Change struct {
	// Fresh is set when the plan was made afresh, and FreshWhy says why
	// the previous plan could not be its base.
	Fresh    bool
	FreshWhy string
	// FreshKind says why as a value (a plan.Fresh kind); plan.FreshFirst:
	// there was no previous plan (FreshWhy then says only that).
	FreshKind string
	// Displaced lists the workers placed again; only for an incremental
	// plan. Unplaced lists, for a degraded plan, the displaced workers it
	// could not place again (its Unplaced).
	Displaced []Displaced
	Unplaced  []Displaced
}

// Summary is the change in one line for a plan's reason: "fresh plan:
// ..." or "re-placed 3 workers (train 0-1: node left n2; eval 0: GPU
// unhealthy n1:3)", then for a degraded plan "8 workers unplaced (env
// 24-31: node left n3)"; empty when nothing was displaced.
func (c *Change) Summary() string {
	if c == nil {
		return ""
	}
	if c.Fresh {
		return "fresh plan: " + c.FreshWhy
	}
	var parts []string
	if n := len(c.Displaced); n > 0 {
		parts = append(parts, fmt.Sprintf("re-placed %d %s (%s)", n, plural(n, "worker", "workers"), groupDisplaced(c.Displaced)))
	}
	if n := len(c.Unplaced); n > 0 {
		parts = append(parts, fmt.Sprintf("%d %s unplaced (%s)", n, plural(n, "worker", "workers"), groupDisplaced(c.Unplaced)))
	}
	return strings.Join(parts, "; ")
}

// groupDisplaced says which workers ds are, by component and cause, in
// component order, then by lowest index: "train 0-1: node left n2; eval
// 0: GPU unhealthy n1:3". Not in the order a run met them: a planner
// restarted on the plan's document meets them in another order than one
// that kept running (its run's state), and its revision must say the
// same.
func groupDisplaced(ds []Displaced) string {
	type group struct {
		comp plan.Component
		why  string
		idx  []int
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, d := range ds {
		why := d.Why
		if d.Where != "" {
			why += " " + d.Where
		}
		k := string(d.Component) + "\x00" + why
		g := byKey[k]
		if g == nil {
			g = &group{comp: d.Component, why: why}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, d.Index)
	}
	for _, g := range groups {
		slices.Sort(g.idx)
	}
	slices.SortStableFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.comp.Rank(), b.comp.Rank()), cmp.Compare(a.idx[0], b.idx[0]), strings.Compare(a.why, b.why))
	})
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = fmt.Sprintf("%s %s: %s", g.comp, plan.FormatRanges(plan.RangesOf(g.idx)), g.why)
	}
	return strings.Join(parts, "; ")
}

// CountMoved counts the workers of next that are not where prev had them
// (same component and index on the same node and GPUs); workers new in
// next count as moved. It reads every worker; Replan counts its own moves
// in proportion to the change.
func CountMoved(prev, next *Plan) int {
	if next == nil {
		return 0
	}
	var old *workerIndex
	if prev != nil {
		if n, ok := countShared(prev, next); ok {
			return n
		}
		if n, ok := countInOrder(prev.Workers, next.Workers); ok {
			return n
		}
		old = indexWorkers(prev.Workers)
	}
	moved := 0
	for _, w := range next.Workers.All() {
		if o := old.get(w.Component, w.Index); o == nil || !samePlace(o, w) {
			moved++
		}
	}
	return moved
}

// countInOrder is CountMoved by one walk over both lists, with no index
// of prev's 160,000 workers: ok only when each list is in strictly
// increasing order of component and index, as the planner writes them
// (a list read back may be in any order, or repeat a worker).
func countInOrder(prev, next plan.Workers) (moved int, ok bool) {
	key := func(w *plan.Worker) (int, bool) {
		k := w.Component.Rank()
		if k < 0 || w.Index < 0 || w.Index > MaxWorkers {
			return 0, false
		}
		return k*(MaxWorkers+1) + w.Index, true
	}
	i, last, lastPrev := 0, -1, -1
	for _, w := range next.All() {
		k, valid := key(w)
		if !valid || k <= last {
			return 0, false
		}
		last = k
		for ; i < prev.Len(); i++ {
			p, valid := key(prev.At(i))
			if !valid || p <= lastPrev {
				return 0, false
			}
			if p >= k {
				break
			}
			lastPrev = p
		}
		if i < prev.Len() {
			if p, _ := key(prev.At(i)); p == k {
				lastPrev = p
				i++
				if samePlace(prev.At(i-1), w) {
					continue
				}
			}
		}
		moved++
	}
	for ; i < prev.Len(); i++ {
		// The rest of prev must be in order too, or a repeat there could
		// have been the worker a next one matched.
		p, valid := key(prev.At(i))
		if !valid || p <= lastPrev {
			return 0, false
		}
		lastPrev = p
	}
	return moved, true
}

// orderKey is w's place in the order plans list workers: by component,
// then index; not ok for a worker no plan lists.
func orderKey(w *plan.Worker) (int, bool) {
	k := w.Component.Rank()
	if k < 0 || w.Index < 0 || w.Index > MaxWorkers {
		return 0, false
	}
	return k*(MaxWorkers+1) + w.Index, true
}

// workersInOrder reports whether ws is in strictly increasing orderKey order.
// A chunk ws shares with was, at the same place, is taken as in order
// within itself, was being a list known in order (or none): only its ends are read, so a replan that changed a
// few chunks of 160,000 workers reads those.
func workersInOrder(ws, was plan.Workers) bool {
	cs, shared := ws.Chunks(), was.Chunks()
	last := -1
	for c, ch := range cs {
		if len(ch) == 0 {
			continue
		}
		if c < len(shared) && sameChunk(ch, shared[c]) {
			first, ok := orderKey(&ch[0])
			if !ok || first <= last {
				return false
			}
			last, _ = orderKey(&ch[len(ch)-1])
			continue
		}
		for i := range ch {
			k, ok := orderKey(&ch[i])
			if !ok || k <= last {
				return false
			}
			last = k
		}
	}
	return true
}

// sameChunk reports whether a and b are one chunk.
func sameChunk(a, b []plan.Worker) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// orderProof says whether the list ws is in order (workersInOrder).
type orderProof struct {
	ws plan.Workers
	in bool
}

// orderedOf is p's workers where they are in order, known with its state
// (found by one walk and kept there, if not known yet) for the very list
// p holds; else not ok.
func orderedOf(p *Plan) (plan.Workers, bool) {
	if p.state == nil || p.Workers.Len() == 0 {
		return plan.Workers{}, false
	}
	pr := p.state.ordered.Load()
	if pr == nil {
		pr = &orderProof{ws: p.Workers, in: workersInOrder(p.Workers, plan.Workers{})}
		p.state.ordered.CompareAndSwap(nil, pr)
	}
	a, b := p.Workers.Chunks(), pr.ws.Chunks()
	if !pr.in || p.Workers.Len() != pr.ws.Len() || len(a) == 0 || len(a) != len(b) || &a[0] != &b[0] {
		return plan.Workers{}, false
	}
	return p.Workers, true
}

// countShared is countInOrder for two plans whose workers are known in
// order: a worker in a chunk both lists share is in prev as it is, the
// only one of its component and index there, so it did not move; the
// others are found in prev by their key. A grow of one worker reads a
// chunk, not 160,000 workers. Not ok where either is not known in order.
func countShared(prev, next *Plan) (int, bool) {
	pw, ok := orderedOf(prev)
	if !ok {
		return 0, false
	}
	nw, ok := orderedOf(next)
	if !ok {
		return 0, false
	}
	pcs := pw.Chunks()
	moved := 0
	for c, ch := range nw.Chunks() {
		if c < len(pcs) && sameChunk(ch, pcs[c]) {
			continue
		}
		for i := range ch {
			w := &ch[i]
			k, _ := orderKey(w)
			at := sort.Search(pw.Len(), func(j int) bool {
				pk, _ := orderKey(pw.At(j))
				return pk >= k
			})
			if at == pw.Len() || !samePlace(pw.At(at), w) {
				moved++
				continue
			}
			if pk, _ := orderKey(pw.At(at)); pk != k {
				moved++
			}
		}
	}
	return moved, true
}

// samePlace reports whether two workers sit on the same node and GPUs.
func samePlace(a, b *plan.Worker) bool {
	return a.NodeID == b.NodeID && slices.Equal(a.GPUs, b.GPUs)
}

// workerIndex finds a plan's workers by component and index without
// hashing a string for each.
type workerIndex [4][]*plan.Worker

func indexWorkers(ws plan.Workers) *workerIndex {
	var x workerIndex
	for _, w := range ws.All() {
		k := w.Component.Rank()
		// Indices need not be dense (a degraded plan lacks its unplaced
		// workers); MaxWorkers bounds them.
		if k < 0 || w.Index < 0 || w.Index > MaxWorkers {
			continue
		}
		for len(x[k]) <= w.Index {
			x[k] = append(x[k], nil)
		}
		x[k][w.Index] = w
	}
	return &x
}

func (x *workerIndex) get(c plan.Component, i int) *plan.Worker {
	k := c.Rank()
	if x == nil || k < 0 || i < 0 || i >= len(x[k]) {
		return nil
	}
	return x[k][i]
}

// moved counts, for a run that started from its previous plan's state,
// the displaced workers that did not land back where they were; buffers
// that changed node are counted by placeBuffers.
func (e *engine) moved() int {
	n := 0
	seen := make(map[[2]int]bool, len(e.displaced))
	for _, d := range e.displaced {
		ci := d.Component.Rank()
		if ci < 0 || ci >= nComp {
			continue // buffers: placeBuffers counts them
		}
		k := [2]int{ci, d.Index}
		if seen[k] {
			continue
		}
		seen[k] = true
		slot := e.base[ci] + d.Index
		if d.Why == WhyNew || !samePlace(e.prev.Workers.At(slot), e.store.at(slot)) {
			n++
		}
	}
	return n
}

// SamePlacement reports whether b places everything where a does, with
// the same pools, buffers, validity, state, unplaced workers and pending
// spec: only then is a new plan no news.
// Plans made one from another share the worker chunks neither changed,
// and those compare at no cost.
func SamePlacement(a, b *Plan) bool {
	if a.Valid() != b.Valid() || a.Error != b.Error || a.Workers.Len() != b.Workers.Len() || len(a.Pools) != len(b.Pools) {
		return false
	}
	if a.PlanState() != b.PlanState() || !slices.EqualFunc(a.Unplaced, b.Unplaced, sameUnplaced) ||
		(a.PendingSpec == nil) != (b.PendingSpec == nil) || a.PendingSpec != nil && *a.PendingSpec != *b.PendingSpec ||
		!sameStatus(a.Status, b.Status) {
		return false
	}
	chunks := b.Workers.Chunks()
	for k, ca := range a.Workers.Chunks() {
		cb := chunks[k]
		if len(ca) != len(cb) {
			return false
		}
		if len(ca) > 0 && &ca[0] == &cb[0] {
			continue
		}
		for i := range ca {
			if !SameWorker(ca[i], cb[i]) {
				return false
			}
		}
	}
	if !maps.EqualFunc(a.StorageToTrainWorkers, b.StorageToTrainWorkers, slices.Equal) {
		return false
	}
	for i, pa := range a.Pools {
		pb := b.Pools[i]
		if pa.Name != pb.Name || !slices.EqualFunc(pa.Nodes.Chunks(), pb.Nodes.Chunks(), func(x, y []plan.PoolNode) bool { return slices.EqualFunc(x, y, samePoolNode) }) {
			return false
		}
	}
	return true
}

// sameStatus compares what a status says of the plan (state, reason and
// the plans named), not its words (Cause) nor why a placement was made
// afresh: a revision from before typed statuses (reason unknown) differs
// from its successor that knows the reason, so that the next revision
// carries it once, and the rules that keep a waiting or degraded plan as
// it was read it from then on. The drains the workers are leaving by a
// deadline count (a drain with a deadline changes no placement, and its
// revision says they are leaving); the drains that moved them do not
// (they describe the revision that moved them).
func sameStatus(a, b plan.Status) bool {
	return a.State == b.State && a.Reason == b.Reason && slices.Equal(a.By, b.By) && plan.SameDrains(a.Leaving, b.Leaving)
}

// SameWorker compares two workers field by field, a nil and an empty list
// alike (plans read back from the stream have been through JSON).
func SameWorker(a, b plan.Worker) bool {
	return a.Component == b.Component && a.Index == b.Index && a.Pool == b.Pool && a.NodeID == b.NodeID &&
		a.IP == b.IP && a.GPUShare == b.GPUShare && a.CPUs == b.CPUs &&
		slices.Equal(a.GPUs, b.GPUs) && slices.Equal(a.GPUUUIDs, b.GPUUUIDs)
}

// sameUnplaced compares two unplaced workers field by field, a nil and
// an empty list alike.
func sameUnplaced(a, b plan.Unplaced) bool {
	return a.Component == b.Component && a.Index == b.Index && a.Reason == b.Reason && a.Pool == b.Pool &&
		a.NodeID == b.NodeID && slices.Equal(a.GPUs, b.GPUs) && slices.Equal(a.GPUUUIDs, b.GPUUUIDs)
}

func samePoolNode(a, b plan.PoolNode) bool {
	return a.NodeID == b.NodeID && a.IP == b.IP && a.TotalGPUs == b.TotalGPUs && a.TotalCPUs == b.TotalCPUs &&
		maps.EqualFunc(a.Allocations, b.Allocations, slices.Equal) &&
		slices.Equal(a.UnhealthyGPUs, b.UnhealthyGPUs) && slices.Equal(a.WorkerCounts.Train, b.WorkerCounts.Train) &&
		slices.Equal(a.WorkerCounts.Eval, b.WorkerCounts.Eval) && slices.Equal(a.WorkerCounts.Env, b.WorkerCounts.Env) &&
		a.GPUModel == b.GPUModel && a.NVLinkDomain == b.NVLinkDomain
}
