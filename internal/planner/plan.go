package planner

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"

	"github.com/poolplanner/poolplanner/plan"
)

// PlanError is a reason no valid plan exists.
type PlanError struct{ Msg string }

func (e *PlanError) Error() string { return e.Msg }

// Compute plans spec on nodes afresh. It always returns a plan document;
// when no valid plan exists the document has Valid false and Error set,
// and the error is returned as well. The plan keeps nodes (Node): the
// caller does not write them after.
func Compute(spec *Spec, nodes []Node) (*Plan, error) {
	return ComputeWith(spec, nodes, Options{})
}

// ComputeWith is Compute with options.
func ComputeWith(spec *Spec, nodes []Node, opt Options) (*Plan, error) {
	return computeView(spec, &nodeView{base: nodes}, opt)
}

// computeView is ComputeWith on a view: the run reads its marks (a view
// with copies is made a slice first, which the run would copy anyway);
// where it falls short, the search of other orders runs on the view as
// nodes of their own (slice).
func computeView(spec *Spec, v *nodeView, opt Options) (*Plan, error) {
	if v.over != nil {
		v.slice()
	}
	e := newEngine(spec, opt)
	e.marks = v.marks
	err := e.run(v.base)
	e.marks = nil
	var short *shortfallError
	if !errors.As(err, &short) || e.rules.manual {
		return e.finish(err)
	}
	// A run that fell short: unless a group's own constraints rule it
	// out, other orders may place every worker (search).
	if e.why.bound = e.staticBinding(); e.why.bound == nil {
		if try := e.search(v.slice()); try != nil {
			return try.finish(nil)
		}
		if e.constrained() {
			e.why.bound = e.contention()
		}
	}
	return e.finish(&shortfallError{e.shortfall()})
}

// Validate reports whether spec can be planned on nodes, and if not, why.
// It runs the planner itself, so validation and planning never disagree.
func Validate(spec *Spec, nodes []Node) error {
	_, err := Compute(spec, nodes)
	return err
}

// Replan plans spec on nodes with prev as a preference: each worker of
// prev whose node, GPUs, UUIDs and CPUs still pass every check a new
// placement meets keeps them, and only the others (the displaced) are
// placed, by the same engine and rules as a fresh plan. A node joining
// therefore moves nobody. Where prev cannot be the base (none, not valid,
// another placement) or the displaced cannot all be placed, Replan plans
// afresh and says why in the Change. Moved is set either way. Like
// Compute it always returns a document and, when no valid plan exists,
// the error too.
//
// A previous plan that places workers (valid or degraded) for this very
// spec (keepsSpec) is never released for want of room: where neither an
// incremental plan nor a fresh one places every worker, the plan is
// degraded (degrade.go): every worker whose place still holds keeps it,
// the displaced are placed where they can be, the rest are listed in
// Unplaced, and the error is a *DegradedError. prev's nodes are read as
// they were when it was planned: the caller gives a changed inventory
// as a new slice (Node), not prev's written over.
func Replan(prev *Plan, spec *Spec, nodes []Node) (*Plan, *Change, error) {
	return replan(prev, spec, nodes, prev != nil && keepsSpec(prev, spec))
}

// replan is Replan; keep says whether a plan that cannot place every
// worker is degraded rather than released.
func replan(prev *Plan, spec *Spec, nodes []Node, keep bool) (*Plan, *Change, error) {
	return replanOn(prev, spec, &nodeView{base: nodes}, keep, false, nil)
}

// replanOn is replan on a view of the nodes: the incremental run reads
// it as it is; a run afresh, or any other that keeps or writes its
// nodes, is given them whole (nodeView.slice). readAll refuses a start
// from prev's state when it was made for other elastic sizes
// (resize.go): every worker is read again, as from a document. released
// (nil: none) says, of the plans holding GPUs of workers the run could
// not keep, whether they release the plan (a higher priority took
// them): a plan that would be degraded is then not made, and the plan
// made afresh, which failed, is the outcome, as the allocator's
// unlessPreempted would make it.
func replanOn(prev *Plan, spec *Spec, v *nodeView, keep, readAll bool, released func(takenBy []string) bool) (*Plan, *Change, error) {
	if why, kind := freshWhy(prev, spec); why != "" {
		return freshOn(prev, spec, v, why, kind)
	}
	e := newEngine(spec, Options{})
	e.prev, e.prevState, e.readAll = prev, prev.state, readAll
	e.degrade = keep
	e.over, e.marks = v.over, v.marks
	err := e.run(v.base)
	e.over, e.marks = nil, nil
	var short *shortfallError
	shortfall, comp := errors.As(err, &short), ""
	if err == nil {
		comp = e.strictSpread()
	}
	nodes := v.base
	if shortfall || comp != "" {
		nodes = v.slice() // a run afresh, or degraded, reads them again
	}
	if shortfall {
		doc, ch, ferr := fresh(prev, spec, nodes, "the incremental plan could not place every worker: "+err.Error(), plan.FreshShortfall)
		if ferr == nil || !keep {
			return doc, ch, ferr
		}
		if released != nil && spec.MaxGPUs == 0 && released(e.takenBy) {
			// Released whole: its degraded plan, a document of every kept
			// worker, would be made only to be dropped.
			return doc, ch, ferr
		}
		return degraded(e, prev, spec, nodes, &Outcome{doc, ch, ferr})
	}
	if comp != "" {
		return fresh(prev, spec, nodes, "nvlink_domain strict: the "+comp+" workers kept span several NVLink domains", plan.FreshDomains)
	}
	doc, err := e.finish(err)
	if err != nil {
		// An invalid plan places nothing: nothing was re-placed either.
		return doc, &Change{}, err
	}
	ch := &Change{Displaced: e.displaced}
	// The fast count indexes the previous plan's workers densely, which a
	// degraded plan's (some unplaced) are not.
	if e.fast && prev.PlanState() != plan.StateDegraded {
		doc.Moved = e.moved() + e.bufferMoves
	} else {
		doc.Moved = CountMoved(prev, doc)
	}
	return doc, ch, nil
}

// fresh plans spec on nodes afresh; why says why in words, kind as a
// plan.Fresh kind.
func fresh(prev *Plan, spec *Spec, nodes []Node, why, kind string) (*Plan, *Change, error) {
	return freshOn(prev, spec, &nodeView{base: nodes}, why, kind)
}

// computeOn is Compute on a view.
func computeOn(spec *Spec, v *nodeView) (*Plan, error) {
	return computeView(spec, v, Options{})
}

// freshOn is fresh on a view.
func freshOn(prev *Plan, spec *Spec, v *nodeView, why, kind string) (*Plan, *Change, error) {
	doc, err := computeOn(spec, v)
	if err == nil {
		doc.Moved = CountMoved(prev, doc)
		if prev != nil && prev.Placed() {
			explainFresh(prev, doc, why)
		}
	}
	return doc, &Change{Fresh: true, FreshWhy: why, FreshKind: kind}, err
}

// explainFresh adds to a plan made afresh, per component, how many of
// the previous plan's workers it moved, and why it did not keep them.
func explainFresh(prev, doc *Plan, why string) {
	old := indexWorkers(prev.Workers)
	moved := map[plan.Component]int{}
	for _, w := range doc.Workers.All() {
		if o := old.get(w.Component, w.Index); o == nil || !samePlace(o, w) {
			moved[w.Component]++
		}
	}
	asked := map[plan.Component]int{}
	for _, w := range doc.Workers.All() {
		asked[w.Component]++
	}
	for _, c := range []plan.Component{plan.Train, plan.Eval, plan.Env, plan.Buffer} {
		if moved[c] == 0 {
			continue
		}
		rc := plan.ReasonCount{Reason: "planned afresh: " + why, Workers: moved[c]}
		i := slices.IndexFunc(doc.Explanations, func(x plan.Explanation) bool { return x.Component == c })
		if i < 0 {
			doc.Explanations = append(doc.Explanations, plan.Explanation{Component: c, Asked: asked[c], Placed: asked[c]})
			i = len(doc.Explanations) - 1
		}
		doc.Explanations[i].Displaced = append(doc.Explanations[i].Displaced, rc)
	}
}

// freshWhy says why prev cannot be the base of an incremental plan for
// spec, in words and as a plan.Fresh kind, or "" when it can.
func freshWhy(prev *Plan, spec *Spec) (why, kind string) {
	sp := spec.Placement
	switch {
	case prev == nil:
		return "first plan", plan.FreshFirst
	case !prev.Placed():
		return "the previous plan was not valid", plan.FreshAfterInvalid
	case prev.Mode != sp.Mode:
		return "placement changed", plan.FreshPlacementChanged
	case sp.Mode != ModeManual && (prev.Strategy != sp.Strategy || prev.EnvStrategy != sp.EnvStrategy):
		return "placement changed", plan.FreshPlacementChanged
	}
	return "", ""
}

// run places the spec: the arithmetic first, then (incremental) the
// previous plan's workers where they still fit, then the passes.
func (e *engine) run(nodes []Node) error {
	order, err := e.sortedNodes(nodes)
	if err != nil {
		return err
	}
	// Before anything is made per worker: a spec of more workers than
	// the cluster could hold is refused in time of its size, not its
	// count. A degraded replan keeps a placement this very spec had, on
	// a cluster that held it: its work is bounded by that.
	if !e.degrade {
		if err := overBound(e.spec, len(order)); err != nil {
			return err
		}
	}
	e.prevAsked, e.prevBase, e.prevSlots = [nComp]int{}, e.base, e.slots
	for _, d := range e.demands {
		e.prevAsked[d.ci] = d.asked
	}
	e.fast = e.prev != nil && e.prevState.reusable(e.spec)
	// notesFrom: the states adoptFast would have started from, where
	// readAll, or a previous plan cut from every worker, has this run
	// read every worker again (keepNotes).
	var notesFrom []*nodeState
	if !e.fast && e.prev != nil && e.prev.PlanState() == plan.StateValid {
		asked, base, slots, ok := e.prevLayout()
		switch {
		case ok && !e.readAll:
			e.fast, e.resized = true, true
			e.prevAsked, e.prevBase, e.prevSlots = asked, base, slots
		case ok:
			notesFrom = e.prevState.table
		case e.prevState == nil && e.prev.notesFrom != nil && e.prev.spec != nil:
			if _, _, _, ok := e.layoutOf(e.prev.spec); ok || specEqual(e.prev.spec, e.spec) {
				notesFrom = e.prev.notesFrom
			}
		}
	}
	if e.fast {
		e.adoptFast(nodes, order)
	} else {
		e.loadAll(nodes, order)
	}
	if err := e.checkCapacity(); err != nil {
		if !e.degrade {
			return err
		}
		// Degraded, the plan places what it can all the same.
		e.capErr = err
	}
	if !e.fast && !e.opt.PoolsOnly {
		// Only once the arithmetic passed: a plan of 160,000 workers that
		// cannot fit (a preempted plan's fresh try) allocates none.
		if e.prev != nil {
			e.store = storeOver(e.prev.Workers, e.slots)
		} else {
			e.store = newStore(e.slots)
		}
	}
	if e.rules.manual {
		if err := e.loadPools(); err != nil {
			return err
		}
	}
	src := e.room
	switch {
	case e.fast:
	case e.prev != nil:
		if notesFrom != nil {
			e.keepNotes(notesFrom)
		}
		e.adoptSlow()
		src = e.room
	default:
		src = make([]int32, len(e.table))
		for i := range src {
			src[i] = int32(i)
		}
	}
	if e.degrade {
		e.seatDisplaced()
	}
	e.attempted = true
	if !e.keepOnly {
		e.place(rankOrder(e.table, src))
	}
	if e.store != nil {
		e.store.clearUnset()
	}
	if err := e.shortfall(); err != nil {
		return &shortfallError{err}
	}
	return nil
}

// shortfallError is a run that left workers unplaced (not a failed check).
type shortfallError struct{ error }

func (e *shortfallError) Unwrap() error { return e.error }

// specEqual reports whether two specs ask for the same thing.
func specEqual(a, b *Spec) bool { return a == b || reflect.DeepEqual(a, b) }

// pyFloat writes x as Python writes a float ("5.0", "2.5"), since the
// messages keep rlightning's wording.
func pyFloat(x float64) string {
	s := strconv.FormatFloat(x, 'f', -1, 64)
	if x == math.Trunc(x) {
		s += ".0"
	}
	return s
}

func pyNum(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
