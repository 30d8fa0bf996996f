package planner

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// A plan is degraded, not released, when a change of the inventory
// leaves it without room for every worker (nodes left, GPUs unhealthy,
// CPUs shrank): its revision keeps every worker whose place still holds,
// places what it can of the displaced by the usual rules, and lists the
// rest in Unplaced, each with why and where it ran last. Valid stays
// false (a plan is valid only whole) and State says "degraded". The plan
// keeps holding its GPUs, and the last places of its unplaced workers
// (PlanAll: no plan of its priority or lower takes them; a higher one
// may preempt it as any plan). Its next run returns each unplaced worker
// to its last place first, where that holds again (returnUnplaced): a
// node that flaps moves only its own workers, and only back.

// DegradedError is the error of a degraded plan: not every worker could
// be placed; the document holds those that were (State "degraded").
type DegradedError struct {
	Msg string
	// Unplaced is how many workers have no place.
	Unplaced int
}

func (e *DegradedError) Error() string { return e.Msg }

// keepsSpec reports whether prev's placement was made for spec: as the
// planner made it, the very spec; read back from JSON, by what the
// document says of it (its demands, mode and strategies).
func keepsSpec(prev *Plan, spec *Spec) bool {
	if prev.spec != nil {
		return specEqual(prev.spec, spec)
	}
	sp := spec.Placement
	if prev.Mode != sp.Mode || sp.Mode != ModeManual && (prev.Strategy != sp.Strategy || prev.EnvStrategy != sp.EnvStrategy) {
		return false
	}
	return slices.Equal(prev.Demands, demandsOf(spec))
}

// SameSpecFacts reports whether documents a and b say the same of the
// specs they were placed for: mode, strategies and demands, all that a
// planner restarted on a document knows of the spec its placement
// follows (keepsSpec). A plan that places as its latest revision does
// but says other facts of its spec is news: left unpublished, the latest
// would tell a restarted planner that its placement follows another spec
// than the one in force, and that planner would keep it as it is,
// unchecked (placeJob: a worker on a node gone stays), where one that
// kept running replans it.
func SameSpecFacts(a, b *Plan) bool {
	return a.Mode == b.Mode && a.Strategy == b.Strategy && a.EnvStrategy == b.EnvStrategy && slices.Equal(a.Demands, b.Demands)
}

// QuotaAdopts reports whether next, a spec stored after spec, differs
// from it in its quota (max_gpus) alone, a quota placed (planned on
// spec) fits: a change a planner adopts, the placement the same and
// nothing published. One that differs in more (constraints, a manual
// pool, priority) may have placed otherwise.
func QuotaAdopts(spec, next *Spec, placed *Plan) bool {
	same := *next
	same.MaxGPUs = spec.MaxGPUs
	if !specEqual(&same, spec) {
		return false
	}
	if next.MaxGPUs > 0 && HeldGPUs(placed) > next.MaxGPUs {
		return false // a degraded placement is not checked by WithinQuota
	}
	held := *placed
	o := WithinQuota(Outcome{Plan: &held}, next)
	return o.Err == nil && o.Plan.Placed()
}

// seatDisplaced notes the slots of the displaced workers, which record
// clears as it places them again: what is left is unplaced.
func (e *engine) seatDisplaced() {
	e.unseated = make(map[int]Displaced, len(e.displaced))
	for _, d := range e.displaced {
		ci := d.Component.Rank()
		if ci < 0 || ci >= nComp || d.Index < 0 || d.Index >= e.demands[ci].asked {
			continue
		}
		e.unseated[e.base[ci]+d.Index] = d
	}
}

// returnUnplaced gives the previous plan's unplaced workers (a degraded
// plan's) their last place where it holds again, as keepOne keeps a
// worker; the others are displaced again, from where they were.
func (e *engine) returnUnplaced(seen [nComp][]bool) {
	for i := range e.prev.Unplaced {
		u := &e.prev.Unplaced[i]
		ci := u.Component.Rank()
		if ci < 0 || ci >= nComp || u.Index < 0 || u.Index >= e.demands[ci].asked || seen[ci][u.Index] {
			continue
		}
		seen[ci][u.Index] = true
		at := int32(-1)
		if u.NodeID != "" {
			at = e.find(u.NodeID)
		}
		if at < 0 {
			why := WhyNew
			if u.NodeID != "" {
				why = WhyNodeLeft
			}
			e.displaced = append(e.displaced, Displaced{Component: u.Component, Index: u.Index, NodeID: u.NodeID, Why: why, Where: u.NodeID})
			continue
		}
		_, g := e.demands[ci].groupAt(u.Index)
		w := plan.Worker{Component: u.Component, Index: u.Index, Pool: u.Pool, NodeID: u.NodeID, IP: e.table[at].node.IP,
			GPUs: u.GPUs, GPUUUIDs: u.GPUUUIDs, CPUs: g.NumCPUs}
		if len(u.GPUs) > 0 {
			_, w.GPUShare = gpuCount(g)
		}
		if why, where, by := e.keepOne(at, &w); why != "" {
			e.displaced = append(e.displaced, Displaced{Component: u.Component, Index: u.Index, NodeID: u.NodeID, Why: why, Where: where, By: by})
		}
	}
}

// degraded is the degraded plan of run e, which fell short; afresh is
// the plan made afresh on the same nodes, which failed too: its error
// is why the spec cannot be placed whole. A degraded plan over its
// max_gpus (the displaced placed on GPUs of their own) keeps only the
// previous plan's workers instead.
func degraded(e *engine, prev *Plan, spec *Spec, nodes []Node, afresh *Outcome) (*Plan, *Change, error) {
	cause := afresh.Plan.Error
	doc, err := e.finishDegraded(cause, afresh)
	if q := spec.MaxGPUs; q > 0 && HeldGPUs(doc) > q {
		k := newEngine(spec, Options{})
		k.prev, k.prevState, k.degrade, k.keepOnly, k.readAll = prev, prev.state, true, true, e.readAll
		if k.run(nodes) != nil { // it falls short: it placed none of the displaced
			e = k
			doc, err = k.finishDegraded(cause, afresh)
		}
	}
	doc.Moved = CountMoved(prev, doc)
	ch := &Change{}
	for _, d := range e.displaced {
		if e.isUnseated(d) {
			ch.Unplaced = append(ch.Unplaced, d)
		} else {
			ch.Displaced = append(ch.Displaced, d)
		}
	}
	return doc, ch, err
}

// isUnseated reports whether displaced worker d is still to place.
func (e *engine) isUnseated(d Displaced) bool {
	ci := d.Component.Rank()
	if e.unseated == nil || ci < 0 || ci > nComp {
		return false
	}
	slot := e.slots + d.Index // a buffer's (unseatBuffer)
	if ci < nComp {
		slot = e.base[ci] + d.Index
	}
	_, ok := e.unseated[slot]
	return ok
}

// finishDegraded makes the document of a run that fell short: what
// finish makes of the workers it placed, less the displaced it could not
// place again, which it lists as unplaced with why and where they ran
// last. It keeps no state: the workers are not the run's slots, and the
// next run reads the document (adoptSlow). cause and afresh are the
// plan's (degraded).
func (e *engine) finishDegraded(cause string, afresh *Outcome) (*Plan, error) {
	doc, _ := e.finish(nil)
	doc.state = nil
	slots := make([]int, 0, len(e.unseated))
	for s := range e.unseated {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	if len(slots) > 0 {
		all := doc.Workers.Slice()
		kept := make([]plan.Worker, 0, len(all)-len(slots))
		k := 0
		for i := range all {
			if k < len(slots) && slots[k] == i {
				k++
				continue
			}
			kept = append(kept, all[i])
		}
		doc.Workers = plan.NewWorkers(kept)
	}
	// Newest first: those that lost their place in this run, then those
	// unplaced before, as they were listed. A worker's return goes in this
	// order (returnUnplaced), so that of two whose last places overlap
	// (one unplaced, another of the plan placed there since, then
	// unplaced too) the one that ran there last returns.
	before := map[[2]int]int{}
	if e.prev != nil {
		for k, u := range e.prev.Unplaced {
			before[[2]int{u.Component.Rank(), u.Index}] = k + 1
		}
	}
	rank := func(s int) int { d := e.unseated[s]; return before[[2]int{d.Component.Rank(), d.Index}] }
	slices.SortStableFunc(slots, func(x, y int) int { return cmp.Compare(rank(x), rank(y)) })
	last := e.lastPlaces()
	for _, s := range slots {
		d := e.unseated[s]
		u := plan.Unplaced{Component: d.Component, Index: d.Index, Reason: d.Why}
		if d.Where != "" {
			u.Reason += " " + d.Where
		}
		if w := last(d.Component, d.Index); w != nil {
			u.Pool, u.NodeID, u.GPUs, u.GPUUUIDs = w.Pool, w.NodeID, w.GPUs, w.GPUUUIDs
		}
		doc.Unplaced = append(doc.Unplaced, u)
	}
	doc.cause, doc.afresh = cause, afresh
	doc.Error = degradedMsg(doc.Unplaced, cause)
	doc.Status = plan.Status{State: plan.StateDegraded, Reason: plan.ReasonSpec, Cause: cause}
	doc.takenBy = e.takenBy
	return doc, &DegradedError{Msg: doc.Error, Unplaced: len(doc.Unplaced)}
}

// lastPlaces finds where a worker of the previous plan ran last: its
// place there, or, unplaced there, the place it ran before.
func (e *engine) lastPlaces() func(c plan.Component, i int) *plan.Unplaced {
	var unplaced map[[2]int]*plan.Unplaced
	return func(c plan.Component, i int) *plan.Unplaced {
		if e.prev == nil {
			return nil
		}
		if w := e.prev.Workers.Find(c, i); w != nil {
			return &plan.Unplaced{Pool: w.Pool, NodeID: w.NodeID, GPUs: w.GPUs, GPUUUIDs: w.GPUUUIDs}
		}
		if unplaced == nil {
			unplaced = map[[2]int]*plan.Unplaced{}
			for k := range e.prev.Unplaced {
				u := &e.prev.Unplaced[k]
				unplaced[[2]int{u.Component.Rank(), u.Index}] = u
			}
		}
		if u := unplaced[[2]int{c.Rank(), i}]; u != nil && u.NodeID != "" {
			return u
		}
		return nil
	}
}

// maxUnplacedGroups bounds the groups of unplaced workers an error names.
const maxUnplacedGroups = 4

// degradedMsg is a degraded plan's error: how many workers are unplaced,
// by component and reason, and why the spec cannot be placed whole.
func degradedMsg(us []plan.Unplaced, cause string) string {
	type group struct {
		comp   plan.Component
		reason string
		idx    []int
	}
	var groups []*group
	by := map[string]*group{}
	for _, u := range us {
		k := string(u.Component) + "\x00" + u.Reason
		g := by[k]
		if g == nil {
			g = &group{comp: u.Component, reason: u.Reason}
			by[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, u.Index)
	}
	var parts []string
	for i, g := range groups {
		if i == maxUnplacedGroups {
			parts = append(parts, fmt.Sprintf("and %d more", len(groups)-i))
			break
		}
		slices.Sort(g.idx)
		parts = append(parts, fmt.Sprintf("%s %s: %s", g.comp, plan.FormatRanges(plan.RangesOf(g.idx)), g.reason))
	}
	return fmt.Sprintf("degraded: %d %s unplaced (%s): %s", len(us), plural(len(us), "worker", "workers"), strings.Join(parts, "; "), cause)
}
