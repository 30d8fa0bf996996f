package planner

import (
	"slices"
	"sort"

	"github.com/poolplanner/poolplanner/plan"
)

// settling names, in a remainder, the free GPUs an elastic group may not
// grow onto yet (ElasticOptions.GrowInto).
const settling = "(free, settling)"

// grower is one elastic group that may grow: job j's group k.
type grower struct{ j, k int }

// growState is what growth has made so far: each job's plan, what it
// holds, and its sizes.
type growState struct {
	docs  []*Plan
	holds []holding
	sizes [][]int
}

func (g *growState) clone() *growState {
	out := &growState{docs: slices.Clone(g.docs), holds: slices.Clone(g.holds), sizes: make([][]int, len(g.sizes))}
	for j := range g.sizes {
		out.sizes[j] = slices.Clone(g.sizes[j])
	}
	return out
}

// grow gives GPUs no plan holds to elastic groups below their max:
// higher priorities first; within a priority, every group grows by the
// same number of workers as far as all can (a binary search), then one
// worker each in turn until each is full or finds no room. A job grows
// only from a valid plan in place, and each growth is an incremental
// plan that keeps every worker where it was and stays within max_gpus;
// a group that gave up workers this run does not grow in it (gaveUp).
func (el *elastic) grow(sizes [][]int, out []Outcome, opt ElasticOptions) ([][]int, []Outcome) {
	el.allocator()
	a := el.a
	st := &growState{docs: make([]*Plan, len(out)), holds: make([]holding, len(out)), sizes: sizes}
	for j := range out {
		st.docs[j] = out[j].Plan
		st.holds[j] = a.holdingOf(out[j].Plan)
	}
	// The groups that may grow, in placing order: a level is a run of
	// equal priorities in it. Gathered here, not returned by a function,
	// so that the list of a run's few groups stays off the heap.
	var all []grower
	for _, j := range a.order {
		if el.refs[j] == nil || score(out[j]) > 1 {
			continue
		}
		for k, r := range el.refs[j] {
			// A group that gave up workers this run does not grow in it:
			// its next indices are the ones it just gave up, so growing
			// would place them again elsewhere, moving them in the one
			// revision a launcher sees. It grows on a later run, into
			// what the takers left.
			if sizes[j][k] < r.max && !el.gaveUp(sizes, j, k) {
				all = append(all, grower{j, k})
			}
		}
	}
	if len(all) == 0 || !el.roomToGrow(st, all, opt) {
		return sizes, out
	}
	settle := el.settling(st, opt)
	el.rel = el.released(sizes, out)
	for len(all) > 0 {
		// One priority level at a time.
		p := el.jobs[all[0].j].priority()
		n := 0
		for n < len(all) && el.jobs[all[n].j].priority() == p {
			n++
		}
		st = el.growLevel(st, all[:n], opt, settle)
		all = all[n:]
	}
	return el.grown(sizes, out, st)
}

// growLevel grows one priority level (whole) in rounds, so that equal
// priorities share the room: each round grows the groups still growing
// by a common number of workers, then by one each in turn. At most
// 2n+2 rounds for n groups: a level's cost stays bounded by its groups,
// however wide their ranges.
func (el *elastic) growLevel(st *growState, whole []grower, opt ElasticOptions, settle *blocker) *growState {
	level := whole
	n := len(whole)
	for round := 0; len(level) > 0 && round < 2*n+2; round++ {
		best := el.growCommon(st, level, opt, settle)
		grewAny := best != st
		st = best
		in := map[grower]bool{}
		for _, g := range level {
			if next, ok := el.growOne(st, g, opt, settle); ok {
				st, in[g], grewAny = next, true, true
			}
		}
		if grewAny {
			// A group that found no room may find it once another has
			// grown (under device-colocate, an env worker grown is a
			// GPU an eval worker can go beside): it is tried again
			// after every round in which something grew, else the
			// next run, on a quiet cluster, would grow it. It joins
			// the level's common growth only once it grows, so that
			// a full group does not hold the others to one worker a
			// round.
			for _, g := range whole {
				if in[g] {
					continue
				}
				if next, ok := el.growOne(st, g, opt, settle); ok {
					st, in[g] = next, true
				}
			}
		}
		level = slices.DeleteFunc(slices.Clone(whole), func(g grower) bool { return !in[g] })
	}
	return st
}

// growCommon grows every group of level by the most workers all of them
// can take at once (a binary search): st itself where none fits. Equal
// priorities grow alike, so that none takes the room another of its
// level could have shared.
func (el *elastic) growCommon(st *growState, level []grower, opt ElasticOptions, settle *blocker) *growState {
	room := 0
	for _, g := range level {
		room = max(room, el.refs[g.j][g.k].max-st.sizes[g.j][g.k])
	}
	// Whole-GPU workers cannot grow past the free GPUs: the bound
	// is tried first, and where it fits, that is the one run.
	if per := el.wholeGPUs(level); per > 0 {
		room = min(room, int(float64(el.freeFor(st, opt))/per))
	}
	lo, hi, best := 0, room+1, st
	if room > 0 {
		if next, ok := el.growBy(st, level, room, settle); ok {
			lo, best = room, next
		} else {
			hi = room
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if next, ok := el.growBy(st, level, mid, settle); ok {
			lo, best = mid, next
		} else {
			hi = mid
		}
	}
	return best
}

// growOne grows g by one worker: ok only where it grew. A group at its
// max, or of whole-GPU workers with fewer GPUs free than one takes, is
// not probed, since no plan could fit it.
func (el *elastic) growOne(st *growState, g grower, opt ElasticOptions, settle *blocker) (*growState, bool) {
	if st.sizes[g.j][g.k] >= el.refs[g.j][g.k].max {
		return st, false
	}
	if per := el.wholeGPUs([]grower{g}); per > 0 && float64(el.freeFor(st, opt)) < per {
		return st, false
	}
	if next, ok := el.growBy(st, []grower{g}, 1, settle); ok {
		return next, true
	}
	return st, false
}

// grown is the run's sizes and outcomes once growth made st: out itself
// where nothing grew. Where every plan was valid and in place, the grown
// plans are the outcome as they are; else every plan is planned once
// more from them (regrown), since an invalid plan's reasons change with
// the room growth took.
func (el *elastic) grown(sizes [][]int, out []Outcome, st *growState) ([][]int, []Outcome) {
	grew, settled := false, true
	for j := range out {
		grew = grew || st.docs[j] != out[j].Plan
		settled = settled && el.jobs[j].Spec != nil && score(out[j]) == 0
	}
	if !grew {
		return sizes, out
	}
	if !settled {
		return el.regrown(sizes, out, st)
	}
	// Every plan valid and in place: none has a reason the room
	// growth took would change, so the grown plans are the outcome.
	for j := range out {
		if st.docs[j] == out[j].Plan {
			continue
		}
		doc := st.docs[j]
		doc.Priority, doc.GPUsHeld = el.jobs[j].Spec.Priority, HeldGPUs(doc)
		doc.Moved = CountMoved(el.jobs[j].Prev, doc)
		out[j] = Outcome{Plan: doc, Change: out[j].Change}
	}
	return st.sizes, out
}

// regrown plans every job once more from this run's plans (some grown,
// st), as the next run on a quiet cluster will: what every other plan
// says (an invalid one's arithmetic, who holds the room it waits for) is
// then said of the room as growth left it. Changes and moves stay
// counted from the jobs' own previous plans. Where a grown plan is not
// kept as grown, nothing grows this run: sizes and out.
func (el *elastic) regrown(sizes [][]int, out []Outcome, st *growState) ([][]int, []Outcome) {
	final := el.runFrom(st.sizes, st.docs)
	for j := range final {
		doc := final[j].Plan
		if st.docs[j] != out[j].Plan && (!doc.Valid() || !keepsAll(st.docs[j], doc)) {
			return sizes, out // not kept as grown: no growth this run
		}
		if el.jobs[j].Spec == nil {
			final[j] = out[j]
			continue
		}
		if len(doc.PreemptedBy) == 0 {
			doc.PreemptedBy = out[j].Plan.PreemptedBy
		}
		if doc.PlanState() == out[j].Plan.PlanState() && keepsAll(st.docs[j], doc) {
			final[j].Change = out[j].Change
		}
		doc.Moved = CountMoved(el.jobs[j].Prev, doc)
	}
	return st.sizes, final
}

// gaveUp reports whether job j's group k is planned at sizes below the
// size it started the run at: it gave up workers this run. (A plan
// grown beside others, growBeside, starts at sizes.)
func (el *elastic) gaveUp(sizes [][]int, j, k int) bool {
	return j < len(el.start) && k < len(el.start[j]) && sizes[j][k] < el.start[j][k]
}

// roomToGrow reports whether growth is worth trying: a free GPU it may
// grow onto, or a group that needs no GPUs.
func (el *elastic) roomToGrow(st *growState, all []grower, opt ElasticOptions) bool {
	for _, g := range all {
		if groupGPUs(el.jobs[g.j].Spec, el.refs[g.j][g.k]) == 0 {
			return true
		}
	}
	found := false
	el.eachFree(st, func(node string, g int) bool {
		found = opt.GrowInto == nil || opt.GrowInto(node, g)
		return !found
	})
	return found
}

func groupGPUs(s *Spec, r elasticRef) float64 {
	if r.c == plan.Eval {
		return s.Scheduling.Eval.NumGPUs
	}
	return s.Scheduling.Env[r.gi].NumGPUs
}

// eachFree calls fn for every healthy GPU no plan holds, until fn says
// stop.
func (el *elastic) eachFree(st *growState, fn func(node string, g int) bool) {
	// Holdings are sorted by node: one cursor each, walked with the
	// nodes, and one node's marks at a time (growth asks this several
	// times a run; a map of every held node's GPUs cost more than the
	// probes).
	next := make([]int, len(st.holds))
	var b []bool
	for i := range el.nodes {
		n := &el.nodes[i]
		if cap(b) < n.GPUs {
			b = make([]bool, n.GPUs)
		}
		b = b[:n.GPUs]
		clear(b)
		whole := false
		for j, h := range st.holds {
			for ; next[j] < len(h) && h[next[j]].at <= int32(i); next[j]++ {
				x := &h[next[j]]
				if x.at != int32(i) || whole {
					continue
				}
				if holdsWhole(x, n) {
					// Every GPU held (most nodes of a plan of the whole
					// cluster): nothing to mark one by one.
					whole = true
					continue
				}
				for _, g := range x.gpus {
					if g >= 0 && g < len(b) {
						b[g] = true
					}
				}
				for _, g := range x.resv {
					if g >= 0 && g < len(b) {
						b[g] = true
					}
				}
			}
		}
		if whole {
			continue
		}
		for g := range n.GPUs {
			if b[g] || !n.free(g) {
				continue
			}
			if !fn(n.ID, g) {
				return
			}
		}
	}
}

// holdsWhole reports whether x holds (uses) every GPU of n: its GPUs,
// sorted and each once, are 0 to GPUs-1.
func holdsWhole(x *hold, n *Node) bool {
	k := len(x.gpus)
	return k == n.GPUs && k > 0 && x.gpus[0] == 0 && x.gpus[k-1] == k-1
}

// settling is the free GPUs growth may not take yet, as a holding
// (nil: none): those opt does not allow.
func (el *elastic) settling(st *growState, opt ElasticOptions) *blocker {
	if opt.GrowInto == nil {
		return nil
	}
	return el.freeHeld(st, func(node string, g int) bool { return !opt.GrowInto(node, g) })
}

// freeHeld is the free GPUs held reports, as a holding of the settling
// (nil: none).
func (el *elastic) freeHeld(st *growState, held func(node string, g int) bool) *blocker {
	by := map[int32]*hold{}
	var order []int32
	el.eachFree(st, func(node string, g int) bool {
		if !held(node, g) {
			return true
		}
		at, ok := el.a.pos(node)
		if !ok {
			return true
		}
		h := by[at]
		if h == nil {
			x := newHold(at, nil, 0)
			h = &x
			by[at] = h
			order = append(order, at)
		}
		h.gpus = append(h.gpus, g)
		return true
	})
	if len(order) == 0 {
		return nil
	}
	slices.Sort(order)
	out := make(holding, len(order))
	for i, at := range order {
		out[i] = *by[at]
	}
	return &blocker{name: settling, h: out}
}

// growBy grows each of level, in turn, by up to n workers (to its max),
// each on what the others hold then; ok only if every one grew as asked.
func (el *elastic) growBy(st *growState, level []grower, n int, settle *blocker) (*growState, bool) {
	next := st.clone()
	for _, g := range level {
		r := el.refs[g.j][g.k]
		want := min(next.sizes[g.j][g.k]+n, r.max)
		if want <= next.sizes[g.j][g.k] {
			continue
		}
		sizes := slices.Clone(next.sizes[g.j])
		sizes[g.k] = want
		doc := el.probe(next, g.j, sizes, settle)
		if doc == nil {
			return nil, false
		}
		next.docs[g.j], next.holds[g.j], next.sizes[g.j] = doc, el.a.holdingOf(doc), sizes
	}
	return next, true
}

// probe plans job j at sizes on what every other job holds (and the
// settling GPUs): the plan, or nil unless it is valid, incremental,
// within max_gpus, and keeps every worker of j's plan where it is.
func (el *elastic) probe(st *growState, j int, sizes []int, settle *blocker) *Plan {
	var in []blocker
	for i := range st.holds {
		if i != j && len(st.holds[i]) > 0 {
			in = append(in, blocker{el.jobs[i].Name, st.holds[i]})
		}
	}
	if settle != nil {
		in = append(in, *settle)
	}
	if r := el.rel[j]; len(r) > 0 {
		// What its shrink gave up this run is for others.
		in = append(in, blocker{name: settling, h: r})
	}
	spec := sized(el.jobs[j].Spec, sizes)
	cur := st.docs[j]
	room := el.a.remainderView(in, st.holds[j], cur != nil && cur.state != nil && cur.Placed())
	doc, ch, err := replanOn(cur, spec, &room, false, el.readAll, nil)
	if err != nil || ch.Fresh || doc.PlanState() != plan.StateValid {
		return nil
	}
	if q := spec.MaxGPUs; q > 0 && HeldGPUs(doc) > q {
		// Over max_gpus on GPUs it did not hold: the workers added may
		// still fit in the room of the GPUs it holds (a shared GPU's
		// other share), where the packing goes once no GPU is free (on
		// the next, quiet run: growth then would change a quiet
		// cluster).
		free := el.freeHeld(st, func(string, int) bool { return true })
		if free == nil {
			return nil
		}
		room = el.a.remainderView(append(in, *free), st.holds[j], cur != nil && cur.state != nil && cur.Placed())
		doc, ch, err = replanOn(cur, spec, &room, false, el.readAll, nil)
		if err != nil || ch.Fresh || doc.PlanState() != plan.StateValid || HeldGPUs(doc) > q {
			return nil
		}
	}
	if !keptAll(cur, doc, ch) {
		return nil
	}
	seedHeld(doc, cur)
	return doc
}

// keepsAll reports whether b places every worker of a where a has it.
func keepsAll(a, b *Plan) bool {
	for _, w := range a.Workers.All() {
		if o := b.Workers.Find(w.Component, w.Index); o == nil || !samePlace(o, w) {
			return false
		}
	}
	return true
}

// allocator is the run's allocator, made once: node positions, holdings
// and remainders.
func (el *elastic) allocator() {
	if el.a == nil {
		el.a = newAllocator(el.jobs, el.nodes)
		el.a.facts = el.facts
	}
}

// annotate says in each elastic plan's status what this run did to its
// sizes (Resized; ReasonShrunk, naming the plans that took the GPUs, or
// ReasonGrew). A plan whose sizes did not change keeps the status of its
// previous revision when nothing else changed, so that a quiet cluster
// publishes nothing.
func (el *elastic) annotate(out []Outcome, sizes [][]int) {
	el.allocator()
	var holds []holding
	for j := range out {
		refs := el.refs[j]
		prev := el.jobs[j].Prev
		if refs == nil || prev == nil || !prev.Placed() || out[j].Plan.PlanState() == plan.StateInvalid {
			continue
		}
		doc := out[j].Plan
		from, to := heldCounts(prev, refs), heldCounts(doc, refs)
		var rs []plan.Resize
		shrunk := false
		for k, r := range refs {
			if from[k] >= 0 && to[k] >= 0 && from[k] != to[k] && doc.PendingSpec == nil {
				rs = append(rs, plan.Resize{Component: r.c, Group: r.gi, From: from[k], To: to[k]})
				shrunk = shrunk || to[k] < from[k]
			}
		}
		st := doc.Status
		st.State = doc.PlanState()
		if len(rs) == 0 {
			if ps := prev.Status; (ps.Reason == plan.ReasonShrunk || ps.Reason == plan.ReasonGrew) && doc.PlanState() == plan.StateValid {
				kept := *doc
				kept.Status = ps
				if SamePlacement(prev, &kept) {
					doc.Status = ps
				}
			}
			continue
		}
		if holds == nil {
			holds = make([]holding, len(out))
			for i := range out {
				holds[i] = el.a.holdingOf(out[i].Plan)
			}
		}
		st.Resized = rs
		if doc.PlanState() == plan.StateValid {
			st.Reason, st.By = plan.ReasonGrew, nil
			if shrunk {
				st.Reason, st.By = plan.ReasonShrunk, el.takers(prev, refs, to, holds)
			}
		}
		doc.Status = st
	}
}

// takers names the plans (in placing order) that now hold a GPU of the
// workers prev gave up (those of refs at sizes or above).
func (el *elastic) takers(prev *Plan, refs []elasticRef, sizes []int, holds []holding) []string {
	held := heldCounts(prev, refs)
	// Only the workers given up are read: a shrink of 8 of 160,000
	// workers reads 8, each checked against every plan once.
	found := make([]bool, len(el.jobs))
	eachIn(prev, refs, sizes, held, func(w *plan.Worker) {
		at, ok := el.a.find(w.NodeID)
		if !ok {
			return
		}
		for i := range found {
			found[i] = found[i] || slices.ContainsFunc(w.GPUs, func(g int) bool { return holds[i].has(at, g) })
		}
	})
	var names []string
	for _, i := range el.a.order {
		if found[i] {
			names = append(names, el.jobs[i].Name)
		}
	}
	return names
}

// eachIn calls fn for each worker of p in refs' groups with an index
// from lo to below hi (each ref's, counted from its first): the workers
// a shrink from hi to lo gives up. A plan the planner made (one with a
// state) keeps its workers in Component.Rank order, each index once and
// ascending, so that those of a group's range lie in a row found by
// search: a shrink reads the workers it gives up, not the other 160,000.
// Where the row does not hold every worker of the range that p does not
// list as unplaced (another order), every worker is read.
func eachIn(p *Plan, refs []elasticRef, lo, hi []int, fn func(*plan.Worker)) {
	ws := p.Workers
	for k, r := range refs {
		from, to := r.first+lo[k], r.first+hi[k]
		if from >= to {
			continue
		}
		if p.state != nil {
			want := to - from
			for _, u := range p.Unplaced {
				if u.Component == r.c && u.Index >= from && u.Index < to {
					want--
				}
			}
			rank := r.c.Rank()
			i := sort.Search(ws.Len(), func(i int) bool {
				w := ws.At(i)
				return w.Component.Rank() > rank || w.Component.Rank() == rank && w.Index >= from
			})
			n, last := i, from-1
			for n < ws.Len() && ws.At(n).Component == r.c && ws.At(n).Index > last && ws.At(n).Index < to {
				last = ws.At(n).Index
				n++
			}
			if n-i == want {
				for ; i < n; i++ {
					fn(ws.At(i))
				}
				continue
			}
		}
		for _, w := range ws.All() {
			if w.Component == r.c && w.Index >= from && w.Index < to {
				fn(w)
			}
		}
	}
}

// wholeGPUs is the GPUs one worker of each of level takes, summed, when
// every one of them takes whole GPUs (0: some take a share, or none).
func (el *elastic) wholeGPUs(level []grower) float64 {
	sum := 0.0
	for _, g := range level {
		n := groupGPUs(el.jobs[g.j].Spec, el.refs[g.j][g.k])
		if n < 1 {
			return 0
		}
		sum += n
	}
	return sum
}

// freeFor counts the free GPUs growth may take.
func (el *elastic) freeFor(st *growState, opt ElasticOptions) int {
	n := 0
	el.eachFree(st, func(node string, g int) bool {
		if opt.GrowInto == nil || opt.GrowInto(node, g) {
			n++
		}
		return true
	})
	return n
}

// released is, per job, the GPUs of the workers its shrink gave up
// this run: a plan's that stays placed (one released whole was preempted,
// not shrunk).
func (el *elastic) released(sizes [][]int, outs []Outcome) map[int]holding {
	out := map[int]holding{}
	for j, refs := range el.refs {
		prev := el.jobs[j].Prev
		if refs == nil || prev == nil || !prev.Placed() || !outs[j].Plan.Placed() {
			continue
		}
		cut := false
		for k := range refs {
			cut = cut || sizes[j][k] < el.start[j][k]
		}
		if !cut {
			continue
		}
		by := map[int32]*hold{}
		// Only the workers given up are read and looked up: a shrink of
		// 8 of 160,000 reads 8 workers and looks up their nodes.
		eachIn(prev, refs, sizes[j], el.start[j], func(w *plan.Worker) {
			at, ok := el.a.find(w.NodeID)
			if !ok {
				return
			}
			h := by[at]
			if h == nil {
				x := newHold(at, nil, 0)
				h = &x
				by[at] = h
			}
			h.gpus = append(h.gpus, w.GPUs...)
		})
		// A GPU the plan holds again (its own fixed workers re-placed
		// there: it healed from its surplus) is not given up: held from
		// its own growth, it would make every probe fail to keep them.
		own := el.a.holdingOf(outs[j].Plan)
		var hs holding
		for _, h := range by {
			slices.Sort(h.gpus)
			h.gpus = slices.DeleteFunc(slices.Compact(h.gpus), func(g int) bool { return own.has(h.at, g) })
			if len(h.gpus) > 0 {
				hs = append(hs, *h)
			}
		}
		slices.SortFunc(hs, func(x, y hold) int { return int(x.at - y.at) })
		out[j] = hs
	}
	return out
}
