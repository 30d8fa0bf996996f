package planner

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Job is one of several plans sharing a cluster.
type Job struct {
	Name string
	// Spec nil: the job holds its Prev as it is (a plan whose spec
	// cannot be read: its workers run on), before every other job and
	// whatever their priority (nothing to replan it with), and is not
	// planned.
	Spec *Spec
	// Prev is the job's latest plan (nil: none yet); its valid placement
	// is what the job holds going in, and what it keeps if it can.
	Prev *Plan
	// Age orders jobs of equal priority: smaller is older, placed first.
	Age uint64
}

// Outcome is what PlanAll made of a job: as Replan's results.
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
// A job placed before one of the same priority sees that one's room as
// it was going in; when that shrinks during the run (a spec scaled down)
// and some job is invalid, PlanAll runs again on the new holdings, so a
// job is invalid only if what higher- and equal-priority jobs finally hold
// leaves it no room. Outcomes are in the order of jobs.
func PlanAll(jobs []Job, nodes []Node) []Outcome {
	a := newAllocator(jobs, nodes)
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
		if pass+1 == maxPasses || !anyInvalid(out) || slices.EqualFunc(next, cur, holding.equal) {
			a.explain(out, prev, next)
			return out
		}
		cur = next
	}
}

func anyInvalid(out []Outcome) bool {
	return slices.ContainsFunc(out, func(o Outcome) bool { return o.Err != nil })
}

// hold is what one job holds on one node.
type hold struct {
	at   int32
	gpus []int // sorted, each once
	cpus float64
}

// holding is what one job holds, by node (sorted by at).
type holding []hold

func (h holding) equal(o holding) bool {
	return slices.EqualFunc(h, o, func(a, b hold) bool {
		return a.at == b.at && a.cpus == b.cpus && slices.Equal(a.gpus, b.gpus)
	})
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
	index map[string]int32
	order []int // jobs in placing order
}

func newAllocator(jobs []Job, nodes []Node) *allocator {
	a := &allocator{jobs: jobs, nodes: nodes, index: make(map[string]int32, len(nodes)), order: make([]int, len(jobs))}
	for i := range nodes {
		a.index[nodes[i].ID] = int32(i)
	}
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

// holdingOf is what a valid plan uses of the nodes there are (nothing
// for an invalid plan, or none): its workers' GPUs and CPUs, and every
// GPU its pools allocate (a GPU reserved for a buffer, a manual pool's
// ranges), which are the plan's too.
func (a *allocator) holdingOf(p *Plan) holding {
	if p == nil || !p.Valid {
		return nil
	}
	by := map[int32]*hold{}
	at := func(id string) *hold {
		i, ok := a.index[id]
		if !ok {
			return nil
		}
		h := by[i]
		if h == nil {
			h = &hold{at: i}
			by[i] = h
		}
		return h
	}
	add := func(h *hold, g int) {
		if i, found := slices.BinarySearch(h.gpus, g); !found {
			h.gpus = slices.Insert(h.gpus, i, g)
		}
	}
	for _, w := range p.Workers.All() {
		if h := at(w.NodeID); h != nil {
			h.cpus += w.CPUs
		}
	}
	EachHeldGPU(p, func(node string, g int) {
		if h := at(node); h != nil {
			add(h, g)
		}
	})
	out := make(holding, 0, len(by))
	for _, h := range by {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(x, y hold) int { return cmp.Compare(x.at, y.at) })
	return out
}

// remainder is the nodes as a job sees them with blockers in the way:
// their GPUs held, their CPUs taken.
func (a *allocator) remainder(blockers []blocker) []Node {
	out := slices.Clone(a.nodes)
	for _, b := range blockers {
		for _, h := range b.h {
			n := &out[h.at]
			n.CPUsHeld += h.cpus
			for _, g := range h.gpus {
				if g < 0 || g >= n.GPUs {
					continue
				}
				if n.HeldBy == nil {
					n.HeldBy = make([]string, n.GPUs)
				}
				if n.HeldBy[g] == "" {
					n.HeldBy[g] = b.name
				}
			}
		}
	}
	return out
}

// pass places every job in order, the jobs not yet placed holding cur.
func (a *allocator) pass(cur []holding) []Outcome {
	out := make([]Outcome, len(a.jobs))
	var placed []blocker
	for k, j := range a.order {
		job := &a.jobs[j]
		if job.Spec == nil {
			out[j] = Outcome{Plan: job.Prev, Change: &Change{}}
			if job.Prev == nil || !job.Prev.Valid {
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
		o := a.place(job, placed, same, lower)
		o.Plan.Priority = job.Spec.Priority
		if o.Err == nil {
			placed = append(placed, blocker{job.Name, a.holdingOf(o.Plan)})
		}
		out[j] = o
	}
	return out
}

// place plans job beside the jobs placed before it and those after it
// (same: of its priority or higher; lower: to give way, lowest last),
// releasing no more of the lower ones than it needs to be placed, and to
// keep its workers where they are.
func (a *allocator) place(job *Job, placed, same, lower []blocker) Outcome {
	// release is how many of the lowest jobs give way.
	try := func(release int) Outcome {
		nodes := a.remainder(slices.Concat(placed, same, lower[:len(lower)-release]))
		doc, ch, err := Replan(job.Prev, job.Spec, nodes)
		o := WithinQuota(Outcome{doc, ch, err}, job.Spec)
		if o.Err != nil && err == nil && job.Prev != nil {
			// Kept workers may hold more GPUs than a fresh packing.
			why := fmt.Sprintf("max_gpus %d: the incremental plan needs %d GPUs", job.Spec.MaxGPUs, HeldGPUs(doc))
			if f := WithinQuota(outcome(fresh(job.Prev, job.Spec, nodes, why)), job.Spec); f.Err == nil {
				return f
			}
		}
		return o
	}
	o := try(0)
	if len(lower) == 0 || o.Err == nil && o.Plan.Moved == 0 {
		return o
	}
	// With every lower job released: if that fails, what higher and
	// equal jobs leave is too little. A job that fits among the lower
	// ones only by moving its own workers takes room from them instead
	// when that keeps more of its workers where they are.
	all := try(len(lower))
	switch {
	case all.Err != nil && o.Err != nil:
		return all
	case all.Err != nil || o.Err == nil && all.Plan.Moved >= o.Plan.Moved:
		return o
	}
	for r := 1; r < len(lower); r++ {
		if some := try(r); some.Err == nil && some.Plan.Moved <= all.Plan.Moved {
			return some
		}
	}
	return all
}

// explain names, for each job, the jobs of higher priority that took
// GPUs it held going in (prev), and says so in an invalid job's error,
// or, for a job that never held any, which jobs hold the room it lacks.
//
// A job that was invalid for want of room already, asks for what it
// asked, and waits on plans that still hold room, keeps the error and
// preempted_by it had until it is placed again: what other plans do
// meanwhile makes it no new revision. An error of the spec's own (a
// manual pool naming a node not there) is never put down to others.
func (a *allocator) explain(out []Outcome, prev, final []holding) {
	for k, j := range a.order {
		o, job := &out[j], &a.jobs[j]
		if job.Spec == nil {
			continue
		}
		var by, holders, names []string
		for _, i := range a.order[:k] {
			other := &a.jobs[i]
			if len(final[i]) == 0 {
				continue
			}
			holders = append(holders, fmt.Sprintf("plan %s (priority %d)", other.Name, other.shownPriority()))
			names = append(names, other.Name)
			if other.priority() > job.Spec.Priority && final[i].overlaps(prev[j]) {
				by = append(by, fmt.Sprintf("plan %s (priority %d)", other.Name, other.shownPriority()))
				o.Plan.PreemptedBy = append(o.Plan.PreemptedBy, other.Name)
			}
		}
		var field *FieldError
		if o.Err == nil || strings.HasPrefix(o.Plan.Error, "max_gpus:") || errors.As(o.Err, &field) || len(holders) == 0 {
			continue
		}
		if p := job.Prev; p != nil && !p.Valid && waiting(p.Error) && samePlacing(p, o.Plan) &&
			p.Priority == job.Spec.Priority && allIn(p.PreemptedBy, names) {
			o.Plan.Error, o.Plan.PreemptedBy, o.Err = p.Error, p.PreemptedBy, &PlanError{Msg: p.Error}
			continue
		}
		msg := "waits for room held by " + strings.Join(holders, ", ") + ": " + o.Plan.Error
		if len(by) > 0 {
			msg = "preempted by " + strings.Join(by, ", ") + ": " + o.Plan.Error
		}
		o.Plan.Error, o.Err = msg, &PlanError{Msg: msg}
	}
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

// waiting reports whether an invalid plan's error is for want of room
// others hold.
func waiting(msg string) bool {
	return strings.HasPrefix(msg, "preempted by ") || strings.HasPrefix(msg, "waits for room held by ")
}

// PlanBeside plans spec afresh as a new plan among others would be
// placed (a validation): on what those in its way hold as their Prev
// leaves (those of its priority or higher, and those held as they are;
// lower ones would give way), within its max_gpus.
func PlanBeside(spec *Spec, nodes []Node, others []Job) (*Plan, error) {
	a := newAllocator(others, nodes)
	var in []blocker
	for i := range others {
		if o := &others[i]; o.priority() >= spec.Priority {
			in = append(in, blocker{o.Name, a.holdingOf(o.Prev)})
		}
	}
	doc, err := Compute(spec, a.remainder(in))
	o := WithinQuota(Outcome{Plan: doc, Err: err}, spec)
	o.Plan.Priority = spec.Priority
	return o.Plan, o.Err
}

func outcome(p *Plan, ch *Change, err error) Outcome { return Outcome{p, ch, err} }

// WithinQuota makes a valid plan that holds more GPUs than spec's
// max_gpus invalid, saying so.
func WithinQuota(o Outcome, spec *Spec) Outcome {
	if o.Err != nil {
		return o
	}
	o.Plan.GPUsHeld = HeldGPUs(o.Plan)
	if q := spec.MaxGPUs; q > 0 && o.Plan.GPUsHeld > q {
		msg := fmt.Sprintf("max_gpus: the plan needs %d GPUs; its quota is %d", o.Plan.GPUsHeld, q)
		return Outcome{Plan: invalidDoc(o.Plan, msg), Change: &Change{}, Err: &PlanError{Msg: msg}}
	}
	return o
}

// HeldGPUs counts the GPUs a plan holds, each once however many
// workers share it: its workers' and those its pools allocate (a GPU
// reserved for a buffer, a manual pool's ranges).
func HeldGPUs(p *Plan) int {
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
	EachAllocated(p, func(_, node string, _ Component, g int) { fn(node, g) })
}

// EachAllocated calls fn for every GPU p's pools allocate to a
// component, with or without a worker on it: pool, node, component (in
// the order train, eval, env), node-local index.
func EachAllocated(p *Plan, fn func(pool, node string, c Component, g int)) {
	for _, pl := range p.Pools {
		for _, n := range pl.Nodes {
			for _, c := range gpuComponents {
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
	out.Valid, out.Error, out.Moved, out.GPUsHeld = false, msg, 0, 0
	out.Placement.ResourcePool = []PoolExport{}
	out.Placement.Pools = []Pool{}
	out.Placement.StorageToTrainWorkers = map[string][]int{}
	return out
}
