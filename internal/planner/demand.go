package planner

import (
	"math"
	"sort"

	"github.com/poolplanner/poolplanner/plan"
)

// demand walks the workers of one component that a run must place, in
// index order: every worker for a fresh plan, the displaced ones for an
// incremental plan. Env groups follow one another.
type demand struct {
	comp   plan.Component
	ci     comp
	groups []WorkerGroup
	// ends[g] is the first index after group g.
	ends []int
	// asked is how many workers the component has in all.
	asked int
	// list holds the indices to place, ascending; nil means lo..hi-1
	// (at first: all of them).
	list   []int
	lo, hi int
	next   int // position in list, or among lo..hi-1
	gi     int // group of the next index
}

// newDemand walks every worker of groups. Empty groups stay, so that
// group positions are the spec's (scheduling.env[i]).
func newDemand(ci comp, groups []WorkerGroup) *demand {
	d := &demand{comp: ci.Component(), ci: ci, groups: groups}
	for _, g := range groups {
		d.asked += max(g.WorkerNum, 0)
		d.ends = append(d.ends, d.asked)
	}
	d.hi = d.asked
	d.seek()
	return d
}

// span limits the demand to the indices lo..hi-1.
func (d *demand) span(lo, hi int) {
	d.list, d.lo, d.hi = nil, lo, hi
	d.next, d.gi = 0, 0
	d.seek()
}

// only limits the demand to the indices in list (ascending).
func (d *demand) only(list []int) {
	d.list = list
	if list == nil {
		d.list = []int{}
	}
	d.next, d.gi = 0, 0
	d.seek()
}

func (d *demand) total() int {
	if d.list == nil {
		return d.hi - d.lo
	}
	return len(d.list)
}

func (d *demand) done() bool { return d.next >= d.total() }

// left is how many workers are still to place.
func (d *demand) left() int { return d.total() - d.next }

func (d *demand) index() int {
	if d.list == nil {
		return d.lo + d.next
	}
	return d.list[d.next]
}

// group is the worker group of the next index.
func (d *demand) group() WorkerGroup { return d.groups[d.gi] }

// groupAt is the group of index i, which must be below asked, and its
// position among the groups.
func (d *demand) groupAt(i int) (int, WorkerGroup) {
	g := sort.SearchInts(d.ends, i+1)
	return g, d.groups[g]
}

func (d *demand) advance() {
	d.next++
	d.seek()
}

func (d *demand) seek() {
	if d.done() {
		return
	}
	for d.index() >= d.ends[d.gi] {
		d.gi++
	}
}

// run is how many of the next workers, at most limit, are consecutive
// indices of the current group: they can be placed in one step.
func (d *demand) run(limit int) int {
	if d.list == nil {
		return min(limit, d.ends[d.gi]-d.index())
	}
	first, end := d.list[d.next], d.ends[d.gi]
	k := 0
	for k < limit && d.next+k < len(d.list) && d.list[d.next+k] == first+k && first+k < end {
		k++
	}
	return k
}

// gpuCount is how many GPUs one worker of g holds, and its share of each.
func gpuCount(g WorkerGroup) (count int, frac float64) {
	switch {
	case g.NumGPUs <= 0:
		return 0, 0
	case g.NumGPUs <= 1:
		return 1, g.NumGPUs
	default:
		return int(math.Round(g.NumGPUs)), 1
	}
}

// gpusNeeded is how many GPUs the component's workers fill when packed in
// order onto fresh GPUs: whole GPUs for multi-GPU workers, next-fit for
// fractions. rlightning truncates fractional totals instead (int(1.5) == 1)
// and leaves workers unplaced; this counts what the packing really needs.
func gpusNeeded(groups []WorkerGroup) int {
	n := 0
	room := 0.0 // capacity left on the current, partly filled GPU
	for _, g := range groups {
		w := g.WorkerNum
		switch {
		case w <= 0 || g.NumGPUs <= 0:
		case g.NumGPUs > 1:
			n += w * int(math.Round(g.NumGPUs))
			room = 0
		default:
			// Next-fit in closed form (a spec may ask for millions of
			// workers): fill what the current GPU has room for, then
			// whole GPUs of per workers each.
			per := int((1 + eps) / g.NumGPUs)
			first := min(w, int((room+eps)/g.NumGPUs))
			room -= float64(first) * g.NumGPUs
			if rest := w - first; rest > 0 {
				full := (rest + per - 1) / per
				n += full
				room = 1 - float64(rest-(full-1)*per)*g.NumGPUs
			}
		}
	}
	return n
}

// indices are worker indices of one component: list, or lo..hi-1 when
// list is nil (a fresh plan's groups: no list of every worker).
type indices struct {
	list   []int
	lo, hi int
}

func (x indices) len() int {
	if x.list == nil {
		return x.hi - x.lo
	}
	return len(x.list)
}

// limit limits d to x.
func (x indices) limit(d *demand) {
	if x.list == nil {
		d.span(x.lo, x.hi)
		return
	}
	d.only(x.list)
}

// byGroup is what d has still to place, by group; d is done after.
func (d *demand) byGroup() []indices {
	out := make([]indices, len(d.groups))
	if d.list == nil {
		for gi := range d.groups {
			lo := d.index()
			if gi > 0 {
				lo = max(lo, d.ends[gi-1])
			}
			out[gi] = indices{lo: lo, hi: max(lo, min(d.ends[gi], d.hi))}
		}
		d.next = d.total()
		return out
	}
	for ; !d.done(); d.advance() {
		out[d.gi].list = append(out[d.gi].list, d.index())
	}
	return out
}
