package planner

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Job is one of several plans sharing a cluster.
type Job struct {
	Name string
	// Spec nil: the job holds its Prev as it is (a plan whose spec
	// cannot be read: its workers run on), before every other job and
	// whatever their priority (nothing to replan it with), and is not
	// planned.
	Spec *Spec
	// Prev is the job's latest plan (nil: none yet); its placement (valid
	// or degraded) is what the job holds going in, and what it keeps if
	// it can.
	Prev *Plan
	// PrevSpec is the spec Prev's placement follows when that is not
	// Spec: the stored spec changed since, or a new one is pending (Prev's
	// PendingSpec). nil: Prev's own as the planner made it, or, for a plan
	// read back from JSON, Spec. A planner that restarts on a revision
	// whose spec is pending must give it.
	PrevSpec *Spec
	// Age orders jobs of equal priority: smaller is older, placed first.
	Age uint64
}

// Outcome is what PlanAll made of a job: as Replan's results. Err is
// set when the plan is not valid: a *DegradedError for a degraded plan
// (Plan.State "degraded": it holds the workers it could place).
type Outcome struct {
	Plan   *Plan
	Change *Change
	Err    error
}

// maxPasses bounds PlanAll's passes (see PlanAll).
const maxPasses = 4

// PlanAll plans several jobs on one cluster so that no GPU serves two
// of them and no node's CPUs are given out beyond its count: a GPU a job
// uses, even in part, is that job's alone.
//
// Jobs are placed in order of priority, then age. Each is replanned from
// its previous plan (Replan: every worker that can stay, stays) on what
// the jobs placed before it hold and what the jobs after it hold now
// leave. Only when that fails does it take room from jobs of strictly
// lower priority, releasing the lowest (and, among equals, the youngest)
// first and no more of them than it needs; those are then replanned on
// what is left, keeping every worker that was not in the way, and give up
// only what they must (displaced as "preempted by plan NAME"). A job of
// equal or higher priority is never disturbed to place another. A job that
// cannot be placed even with every lower one released, or that would
// exceed its max_gpus, is invalid, holds nothing, and says why.
//
// Faults and mistakes never release a running job. A job whose spec is
// unchanged and whose previous plan placed workers (valid or degraded) is
// degraded, not released, when the inventory leaves it too little room
// (Replan): it keeps every worker whose place still holds, places what
// it can of the rest, lists the others, and keeps holding its GPUs and
// its unplaced workers' last places, which no job of its priority or
// lower takes. Only a job of higher priority taking its GPUs releases it,
// as preemption always did. A job whose spec changed and cannot be placed
// on its new spec (for want of room, or an error of the spec's own)
// keeps its previous placement, re-checked against the inventory on the
// spec it follows (PrevSpec), with PendingSpec saying why; it moves to
// the new spec as soon as that fits.
//
// A job placed before one of the same priority sees that one's room as
// it was going in; when that shrinks during the run (a spec scaled down)
// and some job is invalid or its new spec pending, PlanAll runs again on
// the new holdings, so a job is invalid (or its spec pending) only if
// what higher- and equal-priority jobs finally hold leaves it no room. Outcomes are in the order of jobs.
//
// Elastic groups (worker_num {min, max}) are sized first (PlanAllWith):
// a plan gives up its surplus before anyone is preempted for it, and
// grows into GPUs no plan holds.
//
// The plans keep nodes, as Compute's do (Node): the caller does not
// write them after.
func PlanAll(jobs []Job, nodes []Node) []Outcome {
	return PlanAllWith(jobs, nodes, ElasticOptions{})
}

// planFixed is PlanAll on fixed sizes.
func planFixed(jobs []Job, nodes []Node) []Outcome { return planRuns(jobs, nodes, false) }

// planRuns is planFixed; readAll refuses every replan a start from a
// previous state of other elastic sizes (ElasticOptions.readAll).
func planRuns(jobs []Job, nodes []Node, readAll bool) []Outcome {
	out, why := planTrial(jobs, nodes, readAll, nil)
	why()
	return out
}

// planTrial is planRuns (on facts the PlanAll's allocators share, or
// nil) but for the reasons of the plans that are not
// valid (explainWhy), which the outcomes get only once why is called: a
// trial of the elastic search that is not kept needs no words, and
// wording one may plan a spec again, in full.
func planTrial(jobs []Job, nodes []Node, readAll bool, facts *nodeFacts) ([]Outcome, func()) {
	a := newAllocator(jobs, nodes)
	a.readAll, a.facts = readAll, facts
	cur := make([]holding, len(jobs))
	for j := range jobs {
		cur[j] = a.holdingOf(jobs[j].Prev)
	}
	prev := cur
	var out []Outcome
	for pass := 0; ; pass++ {
		out = a.pass(cur)
		next := make([]holding, len(jobs))
		for j := range out {
			next[j] = a.holdingOf(out[j].Plan)
		}
		if pass+1 == maxPasses || !anyShort(out) || slices.EqualFunc(next, cur, holding.equal) {
			ws := a.explainWho(out, prev, next)
			return out, func() { a.explainWhy(out, next, ws) }
		}
		cur = next
	}
}

// anyShort reports whether some job is not valid or keeps its previous
// placement, its new spec pending: one another pass may place.
func anyShort(out []Outcome) bool {
	return slices.ContainsFunc(out, func(o Outcome) bool { return o.Err != nil || o.Plan.PendingSpec != nil })
}

// hold is what one job holds on one node, at its position: the GPUs
// its workers and pools use, and those its unplaced workers (a degraded
// plan's) ran on last, which it keeps for their return (resv), and the
// CPUs, as its holding by id has them (idHold; its id aside). A plan's
// holding by position points at the entries of its holding by id, never
// written once made: 16 bytes a node, not 64, for a plan of 20,000
// nodes laid out again at every grow or shrink.
type hold struct {
	at int32
	*idHold
}

// newHold is a hold at position at of a list of its own.
func newHold(at int32, gpus []int, cpus float64) hold {
	return hold{at: at, idHold: &idHold{gpus: gpus, cpus: cpus}}
}

// holding is what one job holds, by node (sorted by at).
type holding []hold

func (h holding) equal(o holding) bool {
	return slices.EqualFunc(h, o, func(a, b hold) bool {
		return a.at == b.at && a.cpus == b.cpus && slices.Equal(a.gpus, b.gpus) && slices.Equal(a.resv, b.resv)
	})
}

// has reports whether h uses or keeps GPU g of node at.
func (h holding) has(at int32, g int) bool {
	i, found := slices.BinarySearchFunc(h, at, func(x hold, at int32) int { return cmp.Compare(x.at, at) })
	if !found {
		return false
	}
	_, in := slices.BinarySearch(h[i].gpus, g)
	_, kept := slices.BinarySearch(h[i].resv, g)
	return in || kept
}

// overlaps reports whether h and o use a GPU in common.
func (h holding) overlaps(o holding) bool {
	i, j := 0, 0
	for i < len(h) && j < len(o) {
		switch {
		case h[i].at < o[j].at:
			i++
		case h[i].at > o[j].at:
			j++
		default:
			for _, g := range h[i].gpus {
				if _, found := slices.BinarySearch(o[j].gpus, g); found {
					return true
				}
			}
			i, j = i+1, j+1
		}
	}
	return false
}

// blocker is a job's holding in the way of another's.
type blocker struct {
	name string
	h    holding
}

type allocator struct {
	jobs  []Job
	nodes []Node
	index map[string]int32 // by node id; built on first use (pos): dense merges sorted nodes without it
	// held is holdingOf's answers by plan: a plan is not changed in its
	// placement once made, and PlanAll asks again for each outcome.
	held  map[*Plan]holding
	order []int // jobs in placing order
	// pending holds, per job, the outcome of a new spec that could not be
	// placed (its plan kept the previous placement); kept, the spec each
	// job's outcome follows (nil: not known, the placement held as it
	// was). Both are a pass's.
	pending []*Outcome
	kept    []*Spec
	// readAll: replans never start from a state of other elastic sizes
	// (ElasticOptions.readAll).
	readAll bool

	// sorted says whether nodes are sorted by id, once asked (nodesSorted);
	// searched counts the positions pos found without the index.
	sorted   nodesOrder
	searched int
	// facts are those the PlanAll's allocators share (nil: none).
	facts *nodeFacts
}

func newAllocator(jobs []Job, nodes []Node) *allocator {
	a := &allocator{jobs: jobs, nodes: nodes, order: make([]int, len(jobs))}
	for i := range a.order {
		a.order[i] = i
	}
	slices.SortStableFunc(a.order, func(x, y int) int {
		jx, jy := &jobs[x], &jobs[y]
		return cmp.Or(cmp.Compare(jy.priority(), jx.priority()), cmp.Compare(jx.Age, jy.Age), strings.Compare(jx.Name, jy.Name))
	})
	return a
}

// priority is the job's spec's; a job held as it is (no spec) comes
// before every other.
func (j *Job) priority() int {
	if j.Spec == nil {
		return math.MaxInt
	}
	return j.Spec.Priority
}

// shownPriority is the priority a person is told: a job held as it is
// shows its plan's last.
func (j *Job) shownPriority() int {
	if j.Spec == nil && j.Prev != nil {
		return j.Prev.Priority
	}
	if j.Spec == nil {
		return 0
	}
	return j.Spec.Priority
}

// holdingOf is what a plan that places workers (valid or degraded) uses
// of the nodes there are (nothing for an invalid plan, or none): its
// workers' GPUs and CPUs, every GPU its pools allocate (a GPU reserved
// for a buffer, a manual pool's ranges), which are the plan's too, and
// the GPUs a degraded plan's unplaced workers ran on last, which they
// return to.
func (a *allocator) holdingOf(p *Plan) holding {
	if p == nil || !p.Placed() {
		return nil
	}
	if h, ok := a.held[p]; ok {
		return h // a pass's outcome, asked for again as PlanAll's next
	}
	// By dense node positions, from the plan's holding by id: kept with
	// the plan, or patched from its previous plan's (byID), so that a
	// replan does not read 400,000 workers' node ids three times over.
	out := a.denseOf(p)
	if a.held == nil {
		a.held = map[*Plan]holding{}
	}
	a.held[p] = out
	return out
}

// remainder is the nodes as a job that holds own sees them with
// blockers in the way: their GPUs held, their CPUs taken. A GPU a
// blocker only keeps for an unplaced worker is held too, but not from
// the job where it uses or keeps that GPU itself (a plan of higher
// priority took it since): a worker's return never displaces another
// plan's, and of two that would return to one GPU the first placed
// takes it.
func (a *allocator) remainder(blockers []blocker, own holding) []Node {
	v := a.remainderOf(blockers, own, viewCopy)
	return v.slice()
}

// viewKind is how remainderOf writes the holds: into a copy of every
// node (viewCopy), into marks (viewMarks), or, where the blockers hold
// few nodes, into copies of those only (viewSparse; marks where they
// hold many).
type viewKind int

const (
	viewCopy viewKind = iota
	viewMarks
	viewSparse
)

// remainderView is remainder as a view that copies no node it need not:
// sparse for a run that starts from a previous state and only reads the
// nodes (merge), which copies the few a sparse view has over the nodes
// and none of the others (the taker of a shrink replanned beside a plan
// of few nodes); else marks, which no run copies a node for (a shrink's
// taker beside a plan of the whole cluster).
func (a *allocator) remainderView(blockers []blocker, own holding, sparse bool) nodeView {
	if sparse {
		return a.remainderOf(blockers, own, viewSparse)
	}
	return a.remainderOf(blockers, own, viewMarks)
}

// remainderOf is remainder as a view of kind k.
func (a *allocator) remainderOf(blockers []blocker, own holding, k viewKind) nodeView {
	if !slices.ContainsFunc(blockers, func(b blocker) bool { return len(b.h) > 0 }) {
		// Nothing in the way: the nodes themselves, which no run writes
		// (a plan alone on 20,000 nodes copies none).
		return nodeView{base: a.nodes}
	}
	touched := 0
	for _, b := range blockers {
		touched += len(b.h)
	}
	if k == viewSparse && touched > len(a.nodes)/8 {
		k = viewMarks
	}
	var out []Node
	var over map[int]*Node
	var marks []mark
	switch k {
	case viewSparse:
		over = make(map[int]*Node, touched)
	case viewMarks:
		marks = make([]mark, len(a.nodes))
		for i := range a.nodes {
			marks[i] = markOf(&a.nodes[i])
		}
	default:
		out = slices.Clone(a.nodes)
	}
	// at is the mark of position i to write, and its node.
	at := func(i int32) (*[]string, *float64, *Node) {
		switch {
		case marks != nil:
			return &marks[i].heldBy, &marks[i].cpus, &a.nodes[i]
		case over != nil:
			n := over[int(i)]
			if n == nil {
				c := a.nodes[i]
				n = &c
				over[int(i)] = n
			}
			return &n.HeldBy, &n.CPUsHeld, n
		}
		n := &out[i]
		return &n.HeldBy, &n.CPUsHeld, n
	}
	a.writeHolds(blockers, own, at)
	switch {
	case over != nil:
		return nodeView{base: a.nodes, over: over}
	case marks != nil:
		return nodeView{base: a.nodes, marks: marks}
	}
	return nodeView{base: out}
}

// writeHolds writes what blockers hold into the remainder's marks that
// at gives for a position (its HeldBy list, its CPUs held, and its node):
// their GPUs held, their CPUs taken, and the GPUs a blocker keeps for an
// unplaced worker where own neither uses nor keeps them.
func (a *allocator) writeHolds(blockers []blocker, own holding, at func(int32) (*[]string, *float64, *Node)) {
	// A node a blocker holds whole (most of a full cluster's) shares one
	// list of its name: a list with no GPU left unnamed is never written.
	whole := map[string][]string{}
	for _, b := range blockers {
		for _, h := range b.h {
			heldBy, cpus, n := at(h.at)
			*cpus += h.cpus
			if *heldBy == nil && holdsWhole(&h, n) {
				l := whole[b.name]
				if len(l) < n.GPUs {
					l = slices.Repeat([]string{b.name}, n.GPUs)
					whole[b.name] = l
				}
				*heldBy = l[:n.GPUs:n.GPUs]
				continue
			}
			hold := func(g int) {
				if g < 0 || g >= n.GPUs {
					return
				}
				in := a.nodes[h.at].HeldBy
				if l := *heldBy; len(l) == 0 || len(in) > 0 && &l[0] == &in[0] && (g >= len(in) || in[g] == "") {
					// A list of this remainder's own: the caller's (a
					// cluster shared with plans outside this run) is
					// copied on the first write, so that PlanAll never
					// writes its input, and only where it writes.
					c := make([]string, max(n.GPUs, len(in)))
					copy(c, in)
					*heldBy = c
				}
				if (*heldBy)[g] == "" {
					(*heldBy)[g] = b.name
				}
			}
			for _, g := range h.gpus {
				hold(g)
			}
			for _, g := range h.resv {
				if !own.has(h.at, g) {
					hold(g)
				}
			}
		}
	}
}

// pass places every job in order, the jobs not yet placed holding cur.
func (a *allocator) pass(cur []holding) []Outcome {
	out := make([]Outcome, len(a.jobs))
	a.pending, a.kept = make([]*Outcome, len(a.jobs)), make([]*Spec, len(a.jobs))
	var placed []blocker
	for k, j := range a.order {
		job := &a.jobs[j]
		if job.Spec == nil {
			out[j] = Outcome{Plan: job.Prev, Change: &Change{}}
			if p := job.Prev; p != nil && p.PlanState() == plan.StateDegraded {
				out[j].Err = &DegradedError{Msg: p.Error, Unplaced: len(p.Unplaced)}
			}
			if job.Prev == nil || !job.Prev.Placed() {
				msg := "no spec to plan on"
				out[j] = Outcome{Plan: invalidDoc(&Plan{}, msg), Change: &Change{}, Err: &PlanError{Msg: msg}}
			}
			placed = append(placed, blocker{job.Name, cur[j]})
			continue
		}
		var same, lower []blocker // placed after j: in its way, or to give way
		for _, r := range a.order[k+1:] {
			b := blocker{a.jobs[r].Name, cur[r]}
			if a.jobs[r].priority() < job.Spec.Priority {
				lower = append(lower, b)
			} else {
				same = append(same, b)
			}
		}
		o := a.placeJob(j, cur[j], placed, same, lower)
		o.Plan.Priority = job.Spec.Priority
		if o.Plan.Placed() {
			placed = append(placed, blocker{job.Name, a.holdingOf(o.Plan)})
		}
		out[j] = o
	}
	return out
}

// placeSpec is the spec a job's previous placement follows (placeJob):
// PrevSpec, or Prev's own as the planner made it, or, for a plan read
// back from JSON, Spec when the document says it was made for it (its
// demands and placement, keepsSpec; and no spec pending); nil when that
// spec is not known.
func (j *Job) placeSpec() *Spec {
	switch {
	case j.PrevSpec != nil:
		return j.PrevSpec
	case j.Prev.spec != nil:
		return j.Prev.spec
	case j.Prev.PendingSpec == nil && keepsSpec(j.Prev, j.Spec):
		return j.Spec
	}
	return nil
}

// FollowsUnknown reports whether the planner cannot tell which spec
// job's previous placement follows (placeSpec): a plan read back from
// JSON, given no PrevSpec, whose document was not made for Spec (the
// spec changed since) or whose spec is pending. Such a placement is kept
// as it is, not checked against the nodes again; a planner restarted on
// it gives the spec its revision followed as PrevSpec instead.
func (j *Job) FollowsUnknown() bool {
	return j.Spec != nil && j.PrevSpec == nil && j.Prev != nil && j.Prev.Placed() && j.placeSpec() == nil
}

// placeJob plans job j (place): a job whose previous plan places
// workers is degraded rather than released for want of room while its
// spec is the same; with a new spec that cannot be placed, it keeps its
// previous placement on the spec that placement follows, the new spec
// pending (explain says why). Where that spec is not known (placeSpec),
// the placement is kept as it is, not checked again.
func (a *allocator) placeJob(j int, own holding, placed, same, lower []blocker) Outcome {
	job := &a.jobs[j]
	a.kept[j] = job.Spec
	if job.Prev == nil || !job.Prev.Placed() {
		return a.place(job, job.Spec, false, own, placed, same, lower)
	}
	old := job.placeSpec()
	if old != nil && specEqual(old, job.Spec) {
		return a.unlessPreempted(j, job.Spec, a.place(job, job.Spec, true, own, placed, same, lower))
	}
	o := a.place(job, job.Spec, false, own, placed, same, lower)
	if o.Err == nil {
		return o
	}
	var k Outcome
	if old == nil {
		held := *job.Prev
		held.Moved, held.PreemptedBy = 0, nil
		k = Outcome{Plan: &held, Change: &Change{}}
		if !held.Valid() {
			k.Err = &DegradedError{Msg: held.Error, Unplaced: len(held.Unplaced)}
		}
	} else if k = a.unlessPreempted(j, old, a.place(job, old, true, own, placed, same, lower)); !k.Plan.Placed() {
		return o // nothing left to keep: the new spec's error
	}
	a.pending[j], a.kept[j] = &o, old
	k.Plan.PendingSpec = &plan.PendingSpec{Reason: o.Plan.Error}
	return k
}

// unlessPreempted releases a degraded plan whose workers lost their GPUs
// to a plan of higher priority, as preemption always did (its error is
// a fresh plan's on what is left); only faults degrade.
func (a *allocator) unlessPreempted(j int, spec *Spec, o Outcome) Outcome {
	if o.Plan.PlanState() != plan.StateDegraded || o.Plan.afresh == nil || !a.releases(&a.jobs[j], o.Plan.takenBy) {
		return o
	}
	if r := o.Plan.releasedAs; r != nil {
		return WithinQuota(*r, spec)
	}
	return WithinQuota(*o.Plan.afresh, spec)
}

// releases reports whether one of the plans named took GPUs of job as a
// plan of higher priority.
func (a *allocator) releases(job *Job, takenBy []string) bool {
	for _, name := range takenBy {
		for i := range a.jobs {
			if a.jobs[i].Name == name && a.jobs[i].priority() > job.Spec.Priority {
				return true
			}
		}
	}
	return false
}

// place plans job on spec beside the jobs placed before it and those
// after it (same: of its priority or higher; lower: to give way, lowest
// last), releasing no more of the lower ones than it needs to be placed,
// and to keep its workers where they are. keep: degraded rather than
// released for want of room (replan); a degraded job takes no room from
// lower ones unless that places it whole.
func (a *allocator) place(job *Job, spec *Spec, keep bool, own holding, placed, same, lower []blocker) Outcome {
	// release is how many of the lowest jobs give way.
	// A job that replans from its previous state reads its nodes only
	// once: it may be given them as a view.
	view := job.Prev != nil && job.Prev.state != nil && job.Prev.Placed()
	room := func(release int) *nodeView {
		v := a.remainderView(slices.Concat(placed, same, lower[:len(lower)-release]), own, view)
		return &v
	}
	tryOn := func(nodes *nodeView) Outcome {
		var released func([]string) bool
		if keep && len(lower) == 0 {
			// Its only try, whose degraded outcome unlessPreempted
			// releases when a plan of higher priority took its GPUs.
			released = func(by []string) bool { return a.releases(job, by) }
		}
		doc, ch, err := replanOn(job.Prev, spec, nodes, keep, a.readAll, released)
		if doc.Placed() {
			a.byID(doc) // kept with doc: HeldGPUs reads it
		}
		o := WithinQuota(Outcome{doc, ch, err}, spec)
		if o.Err != nil && err == nil && job.Prev != nil {
			// Kept workers may hold more GPUs than a fresh packing.
			why := fmt.Sprintf("max_gpus %d: the incremental plan needs %d GPUs", spec.MaxGPUs, HeldGPUs(doc))
			if f := WithinQuota(outcome(freshOn(job.Prev, spec, nodes, why, plan.FreshQuota)), spec); f.Err == nil {
				return f
			}
		}
		return o
	}
	try := func(release int) Outcome { return tryOn(room(release)) }
	first := room(0)
	// A new plan that the arithmetic says cannot fit beside every lower
	// plan fails there: unless it fails with them released too, that
	// failure is never read, and planning it afresh on every node to
	// find it out (a plan of higher priority arriving on a full cluster)
	// is not done.
	short := len(lower) > 0 && (job.Prev == nil || !job.Prev.Placed()) && cannotFitOn(spec, first)
	var o Outcome
	if !short {
		o = tryOn(first)
		if len(lower) == 0 || o.Err == nil && (o.Plan.Moved == 0 || placesAnew(job, spec)) {
			return o
		}
	}
	// With every lower job released: if that fails, what higher and
	// equal jobs leave is too little. A job that fits among the lower
	// ones only by moving its own workers takes room from them instead
	// when that keeps more of its workers where they are.
	all := try(len(lower))
	if !short || all.Err != nil {
		if short {
			o = tryOn(first)
		}
		switch {
		case all.Err != nil && o.Err != nil && o.Plan.Placed():
			if all.Plan.afresh != nil {
				o.Plan.releasedAs = all.Plan.afresh
			} else if !all.Plan.Placed() {
				o.Plan.releasedAs = &all
			}
			return o
		case all.Err != nil && o.Err != nil:
			return all
		case all.Err != nil || o.Err == nil && all.Plan.Moved >= o.Plan.Moved:
			return o
		}
	}
	for r := 1; r < len(lower); r++ {
		if some := try(r); some.Err == nil && some.Plan.Moved <= all.Plan.Moved {
			return some
		}
	}
	return all
}

// placesAnew reports whether every plan of spec for job counts every
// worker as moved, and has as many: it keeps none (no previous
// placement), and has no buffers, whose number follows the nodes train
// lands on. A valid plan beside every lower job is then as good as any
// that takes room from them.
func placesAnew(job *Job, spec *Spec) bool {
	return (job.Prev == nil || !job.Prev.Placed()) && (spec.Scheduling.Buffer == nil || spec.Scheduling.Train == nil || spec.Scheduling.Train.WorkerNum <= 0)
}

// A run's explanation (explainWho, then explainWhy) names, for each
// job, the jobs of higher priority that took GPUs it held going in
// (prev), and says why a job is not valid, or
// why its new spec is pending, in terms a person can act on (reason):
// preempted by the plans that took its GPUs, or waiting for room held
// by the plans that hold what it lacks, only where it would fit if they
// gave way; else its spec's own reason.
//
// A job that was invalid for want of room already, asks for what it
// asked, and waits on plans that still hold room, keeps the error and
// preempted_by it had until it is placed again: what other plans do
// meanwhile makes it no new revision. An error of the spec's own (a
// manual pool naming a node not there) is never put down to others.

// inWay is, for one job, the jobs in its way (holders: placed before
// it, or after it and of its priority or higher, which it may not take
// from; names, theirs) and those of them of higher priority that took
// GPUs it held going in (by).
type inWay struct {
	by, holders []int
	names       []string
}

// explainWho is explain's first half: who is in each job's way, and
// preempted_by. It is all that how a job fares (elastic.go's score)
// reads; explainWhy words the reasons, which may plan the spec again.
func (a *allocator) explainWho(out []Outcome, prev, final []holding) []inWay {
	ws := make([]inWay, len(out))
	for k, j := range a.order {
		o, job := &out[j], &a.jobs[j]
		if job.Spec == nil {
			continue
		}
		w := &ws[j]
		for n, i := range a.order {
			other := &a.jobs[i]
			if i == j || len(final[i]) == 0 || n > k && other.priority() < job.Spec.Priority {
				continue
			}
			w.holders = append(w.holders, i)
			w.names = append(w.names, other.Name)
			if other.priority() > job.Spec.Priority && final[i].overlaps(prev[j]) {
				w.by = append(w.by, i)
				o.Plan.PreemptedBy = append(o.Plan.PreemptedBy, other.Name)
			}
		}
	}
	return ws
}

// explainWhy is explain's second half, on what explainWho found (ws).
func (a *allocator) explainWhy(out []Outcome, final []holding, ws []inWay) {
	for _, j := range a.order {
		o, job := &out[j], &a.jobs[j]
		if job.Spec == nil {
			continue
		}
		by, holders, names := ws[j].by, ws[j].holders, ws[j].names
		if p := a.pending[j]; p != nil {
			// The new spec's reason: no job took anything for it.
			w := a.reason(job.Spec, p.Plan, p.Err, holders, nil, final)
			o.Plan.PendingSpec = &plan.PendingSpec{Reason: w.msg}
		}
		switch o.Plan.PlanState() {
		case plan.StateValid:
			continue
		case plan.StateDegraded:
			if a.kept[j] == nil {
				continue // held as it was
			}
			var err error
			if o.Plan.afresh != nil {
				err = o.Plan.afresh.Err
			}
			if p := job.Prev; p != nil && keepsReason(p, o.Plan, names) {
				// As it was, for the same cause, naming plans that still
				// hold room: no new revision, and no plans made to check.
				o.Plan.Error, o.Plan.Status = p.Error, p.Status
			} else {
				var afresh *Plan
				if o.Plan.afresh != nil {
					afresh = o.Plan.afresh.Plan
				}
				w := a.reason(a.kept[j], afresh, err, holders, nil, final)
				o.Plan.Error = degradedMsg(o.Plan.Unplaced, w.msg)
				o.Plan.Status = plan.Status{State: plan.StateDegraded, Reason: w.kind, By: w.by, Cause: o.Plan.cause}
			}
			o.Err = &DegradedError{Msg: o.Plan.Error, Unplaced: len(o.Plan.Unplaced)}
			continue
		}
		if p := job.Prev; p != nil && p.PlanState() == plan.StateInvalid && waiting(p.Status.Reason) && samePlacing(p, o.Plan) &&
			p.Priority == job.Spec.Priority && allIn(p.PreemptedBy, names) && allIn(p.Status.By, names) {
			o.Plan.Error, o.Plan.PreemptedBy, o.Plan.Status, o.Err = p.Error, p.PreemptedBy, p.Status, &PlanError{Msg: p.Error}
			continue
		}
		if w := a.reason(job.Spec, o.Plan, o.Err, holders, by, final); w.kind != plan.ReasonSpec && w.kind != plan.ReasonQuota {
			o.Plan.Error, o.Err = w.msg, &PlanError{Msg: w.msg}
			o.Plan.Status = plan.Status{State: plan.StateInvalid, Reason: w.kind, By: w.by, Cause: w.cause}
		}
	}
}

// keepsReason reports whether degraded plan p, the previous revision of
// degraded plan o, says why as o would: the same unplaced workers, the
// same cause, and any plans it says hold the room among names.
func keepsReason(p, o *Plan, names []string) bool {
	if p.PlanState() != plan.StateDegraded || p.Priority != o.Priority || !slices.EqualFunc(p.Unplaced, o.Unplaced, sameUnplaced) {
		return false
	}
	st := p.Status
	return st.State == plan.StateDegraded && st.Cause == o.cause && allIn(st.By, names)
}

// verdict is reason's answer: why, in words (msg) and as a value (kind,
// a plan.Reason; by, the plans it names; cause, the spec's own reason
// it comes down to).
type verdict struct {
	msg, cause string
	kind       plan.Reason
	by         []string
}

// maxHolderChecks bounds the plans reason tries one by one as the one
// that, giving way, would make room.
const maxHolderChecks = 6

// reason words msg, why spec cannot be placed beside the jobs in its
// way (holders: what they hold, final), for a person to act on:
// "preempted by plan X (priority N): msg" when plans of higher priority
// took its GPUs (by) and it would fit with the room back; "waits for
// room held by plan X (priority N): msg" when it would fit if X gave way
// (each of the holders that alone would do; all of them when none alone
// would); else msg, its spec's own reason. An error of the spec's own,
// or its quota, is never put down to others. doc is the plan that
// failed, whose Error is msg and whose Status says whether it was its
// quota (nil: no plan, nothing said).
func (a *allocator) reason(spec *Spec, doc *Plan, err error, holders, by []int, final []holding) verdict {
	own := verdict{kind: plan.ReasonSpec}
	if doc != nil {
		own.msg, own.cause = doc.Error, doc.Error
		if doc.Status.Reason == plan.ReasonQuota {
			own.kind = plan.ReasonQuota
		}
	}
	var field *FieldError
	if own.kind == plan.ReasonQuota || errors.As(err, &field) || len(holders) == 0 {
		return own
	}
	if !a.fitsWithout(spec, holders, final, holders) {
		return own
	}
	if len(by) > 0 {
		return verdict{msg: "preempted by " + a.named(by) + ": " + own.msg, kind: plan.ReasonPreempted, by: a.names(by), cause: own.msg}
	}
	var need []int
	if len(holders) > 1 && len(holders) <= maxHolderChecks {
		for _, i := range holders {
			if a.fitsWithout(spec, holders, final, []int{i}) {
				need = append(need, i)
			}
		}
	}
	if len(need) == 0 {
		need = holders
	}
	return verdict{msg: "waits for room held by " + a.named(need) + ": " + own.msg, kind: plan.ReasonWaiting, by: a.names(need), cause: own.msg}
}

// names are the jobs' names.
func (a *allocator) names(jobs []int) []string {
	out := make([]string, len(jobs))
	for n, i := range jobs {
		out[n] = a.jobs[i].Name
	}
	return out
}

// fitsWithout reports whether spec could be planned afresh, within its
// quota, on what the jobs of holders hold (final) but those of gone.
func (a *allocator) fitsWithout(spec *Spec, holders []int, final []holding, gone []int) bool {
	var in []blocker
	for _, i := range holders {
		if !slices.Contains(gone, i) {
			in = append(in, blocker{a.jobs[i].Name, final[i]})
		}
	}
	v := a.remainderView(in, nil, false)
	doc, err := computeOn(spec, &v)
	return err == nil && WithinQuota(Outcome{Plan: doc}, spec).Err == nil
}

// named is the jobs as a reason names them: "plan a (priority 0), plan b
// (priority 5)".
func (a *allocator) named(jobs []int) string {
	parts := make([]string, len(jobs))
	for n, i := range jobs {
		parts[n] = fmt.Sprintf("plan %s (priority %d)", a.jobs[i].Name, a.jobs[i].shownPriority())
	}
	return strings.Join(parts, ", ")
}

// samePlacing reports whether two plans' documents ask for the same
// (demands, mode, strategies).
func samePlacing(a, b *Plan) bool {
	return slices.Equal(a.Demands, b.Demands) && a.Mode == b.Mode && a.Strategy == b.Strategy && a.EnvStrategy == b.EnvStrategy
}

// allIn reports whether every one of names is in set.
func allIn(names, set []string) bool {
	for _, n := range names {
		if !slices.Contains(set, n) {
			return false
		}
	}
	return true
}

// waiting reports whether a plan's status reason is for want of room
// others hold.
func waiting(reason plan.Reason) bool {
	return reason == plan.ReasonPreempted || reason == plan.ReasonWaiting
}

// PlanBeside plans spec afresh as a new plan among others would be
// placed (a validation): on what those in its way hold as their Prev
// leaves (those of its priority or higher, and those held as they are;
// lower ones would give way), within its max_gpus. An elastic other
// counts at its minimum: the replan (PlanAllWith) gives its surplus up
// before it leaves a plan invalid.
func PlanBeside(spec *Spec, nodes []Node, others []Job) (*Plan, error) {
	a := newAllocator(others, nodes)
	var in []blocker
	for i := range others {
		if o := &others[i]; o.priority() >= spec.Priority {
			prev := o.Prev
			if refs := elasticRefs(o.Spec); len(refs) > 0 && prev != nil {
				floor := make([]int, len(refs))
				for k, r := range refs {
					floor[k] = r.min
				}
				cut := *o
				cutTo(&cut, refs, floor, false)
				prev = cut.Prev
			}
			in = append(in, blocker{o.Name, a.holdingOf(prev)})
		}
	}
	nodes = a.remainder(in, nil)
	doc, err := Compute(spec, nodes)
	o := WithinQuota(Outcome{Plan: doc, Err: err}, spec)
	o.Plan.Priority = spec.Priority
	if o.Err == nil {
		// An elastic spec: what its minimum needs, and what it would get.
		o.Plan = growBeside(o.Plan, spec, nodes)
	}
	return o.Plan, o.Err
}

func outcome(p *Plan, ch *Change, err error) Outcome { return Outcome{p, ch, err} }

// WithinQuota makes a valid plan that holds more GPUs than spec's
// max_gpus invalid, saying so. A spec that no placement fits within its
// quota (leastGPUs) is refused so whether it was placed or not: were it
// refused for want of room when others hold the GPUs, and for its quota
// when they are free, others growing into GPUs it never took would
// change its reason, and publish a revision on a quiet cluster.
func WithinQuota(o Outcome, spec *Spec) Outcome {
	if o.Plan.PlanState() == plan.StateDegraded {
		// Kept within its quota as it was made (degraded).
		o.Plan.GPUsHeld = HeldGPUs(o.Plan)
		return o
	}
	q := spec.MaxGPUs
	if q > 0 {
		if least := leastGPUs(spec); least > q {
			return overQuota(o.Plan, least, q)
		}
	}
	if o.Err != nil {
		return o
	}
	o.Plan.GPUsHeld = HeldGPUs(o.Plan)
	if q > 0 && o.Plan.GPUsHeld > q {
		return overQuota(o.Plan, o.Plan.GPUsHeld, q)
	}
	return o
}

// overQuota is the outcome of a plan refused for its quota q, needing
// need GPUs; doc is the plan as placed, or as it failed.
func overQuota(doc *Plan, need, q int) Outcome {
	msg := fmt.Sprintf("max_gpus: the plan needs %d GPUs; its quota is %d", need, q)
	out := invalidDoc(doc, msg)
	out.Status.Reason = plan.ReasonQuota
	return Outcome{Plan: out, Change: &Change{}, Err: &PlanError{Msg: msg}}
}

// HeldShares is the GPUs a plan's workers hold, each worker's share of
// each of its GPUs summed: what it uses, where HeldGPUs counts what it
// keeps others off (a GPU shared by workers counts once, in whole).
func HeldShares(p *Plan) float64 {
	held := 0.0
	for _, w := range p.Workers.All() {
		held += w.GPUShare * float64(len(w.GPUs))
	}
	return held
}

// HeldGPUs counts the GPUs a plan holds, each once however many
// workers share it: its workers' and those its pools allocate (a GPU
// reserved for a buffer, a manual pool's ranges).
func HeldGPUs(p *Plan) int {
	if p.state != nil {
		if h := p.state.held.Load(); h != nil {
			return heldCount(*h)
		}
	}
	// A bit per GPU, a set per node, and the last node's set at hand:
	// workers and allocations come node by node, so a map of every GPU
	// of the cluster (a quarter of the offline planner's time at 20,000
	// nodes) is not needed.
	type gpus struct{ bits []uint64 }
	held := map[string]*gpus{}
	var lastNode string
	var last *gpus
	n := 0
	EachHeldGPU(p, func(node string, g int) {
		if last == nil || node != lastNode {
			if last = held[node]; last == nil {
				last = &gpus{}
				held[node] = last
			}
			lastNode = node
		}
		w, bit := g/64, uint64(1)<<(g%64)
		for len(last.bits) <= w {
			last.bits = append(last.bits, 0)
		}
		if last.bits[w]&bit == 0 {
			last.bits[w] |= bit
			n++
		}
	})
	return n
}

// EachHeldGPU calls fn for every GPU p's workers use and every GPU its
// pools allocate (some more than once).
func EachHeldGPU(p *Plan, fn func(node string, g int)) {
	for _, w := range p.Workers.All() {
		for _, g := range w.GPUs {
			fn(w.NodeID, g)
		}
	}
	EachAllocated(p, func(_, node string, _ plan.Component, g int) { fn(node, g) })
}

// EachAllocated calls fn for every GPU p's pools allocate to a
// component, with or without a worker on it: pool, node, component (in
// the order train, eval, env), node-local index.
func EachAllocated(p *Plan, fn func(pool, node string, c plan.Component, g int)) {
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes.All() {
			for _, c := range plan.GPUComponents {
				for _, r := range n.Allocations[c] {
					for g := r.First; g <= r.Last; g++ {
						fn(pl.Name, n.NodeID, c, g)
					}
				}
			}
		}
	}
}

// invalidDoc is doc made invalid for msg: its header, no placement.
func invalidDoc(doc *Plan, msg string) *Plan {
	out := &Plan{}
	out.Header = doc.Header
	out.Error, out.Moved, out.GPUsHeld = msg, 0, 0
	out.Unplaced, out.PendingSpec = nil, nil
	out.Status = plan.Status{State: plan.StateInvalid, Reason: plan.ReasonSpec, Cause: msg}
	out.Placement.ResourcePool = []plan.PoolExport{}
	out.Placement.Pools = []plan.Pool{}
	out.Placement.StorageToTrainWorkers = map[string][]int{}
	return out
}
