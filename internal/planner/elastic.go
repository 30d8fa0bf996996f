package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Elastic groups: eval, and the last env entry, may give worker_num as
// {min: M, max: N}. The planning core plans fixed counts only; this file
// sizes each elastic group (WorkerNum between Min and Max) before the
// core sees a spec, and decides the sizes: every plan's minimum first,
// surplus given up before anyone is preempted or degraded, and GPUs
// nobody needs grown into last. Growing adds workers with the next
// indices; shrinking drops the highest ones, so indices stay dense.

// Elastic reports whether the group's worker count is a range.
func (g *WorkerGroup) Elastic() bool { return g != nil && g.Max > 0 }

// parseRange reads worker_num {min: M, max: N}.
func parseRange(field string, m map[string]any, allowed bool, g *WorkerGroup) error {
	if !allowed {
		return fieldErr(field, "a range {min, max} is allowed only for eval and env; want a whole number >= 0")
	}
	if err := onlyKeys(field, m, "min", "max"); err != nil {
		return err
	}
	get := func(key string) (int, error) {
		raw, ok := m[key]
		if !ok || raw == nil {
			return 0, fieldErr(field+"."+key, "missing; want a whole number of workers >= 1")
		}
		n, ok := number(raw)
		if !ok || n < 1 || n != math.Trunc(n) || n > MaxWorkers {
			return 0, fieldErr(field+"."+key, "%s is not allowed; want a whole number of workers from 1 to %d", show(raw), MaxWorkers)
		}
		return int(n), nil
	}
	lo, err := get("min")
	if err != nil {
		return err
	}
	hi, err := get("max")
	if err != nil {
		return err
	}
	if lo > hi {
		return fieldErr(field, "min %d is above max %d; want 1 <= min <= max", lo, hi)
	}
	g.Min, g.Max, g.WorkerNum = lo, hi, lo
	return nil
}

// checkElastic checks where a spec's elastic groups may be: only the
// last env entry (env workers are numbered across entries, and growing
// an earlier one would renumber the later ones' workers), and only in
// auto mode (manual pools fix every count).
func checkElastic(s *Spec) error {
	sc := &s.Scheduling
	for i := range sc.Env {
		if sc.Env[i].Elastic() && i != len(sc.Env)-1 {
			return fieldErr(fmt.Sprintf("scheduling.env[%d].worker_num", i), "only the last env entry may be a range {min, max}: env workers are numbered across entries; move it last or give a number")
		}
	}
	for _, r := range elasticRefs(s) {
		if s.Placement.Mode == ModeManual {
			return fieldErr(groupName(r.c, r.gi)+".worker_num", "a range {min, max} needs placement.mode auto: manual pools fix each component's GPUs")
		}
	}
	return nil
}

// elasticRef is one elastic group of a spec: component c (eval or env),
// entry gi, its workers' indices starting at first.
type elasticRef struct {
	c        plan.Component
	gi       int
	first    int
	min, max int
}

func (r elasticRef) String() string {
	if r.c == plan.Env && r.gi > 0 {
		return fmt.Sprintf("env[%d]", r.gi)
	}
	return string(r.c)
}

// elasticRefs lists spec's elastic groups, eval first.
func elasticRefs(s *Spec) []elasticRef {
	if s == nil {
		return nil
	}
	var out []elasticRef
	sc := &s.Scheduling
	if sc.Eval.Elastic() {
		out = append(out, elasticRef{c: plan.Eval, min: sc.Eval.Min, max: sc.Eval.Max})
	}
	first := 0
	for i := range sc.Env {
		if sc.Env[i].Elastic() {
			out = append(out, elasticRef{c: plan.Env, gi: i, first: first, min: sc.Env[i].Min, max: sc.Env[i].Max})
		}
		first += sc.Env[i].WorkerNum
	}
	return out
}

// sized is spec with each elastic group planned at counts (one per
// elasticRefs entry); spec itself is not changed.
func sized(s *Spec, counts []int) *Spec {
	refs := elasticRefs(s)
	if len(refs) == 0 || len(counts) != len(refs) {
		return s
	}
	out := *s
	out.Scheduling.Env = slices.Clone(s.Scheduling.Env)
	for k, r := range refs {
		switch r.c {
		case plan.Eval:
			g := *s.Scheduling.Eval
			g.WorkerNum = counts[k]
			out.Scheduling.Eval = &g
		case plan.Env:
			out.Scheduling.Env[r.gi].WorkerNum = counts[k]
		}
	}
	return &out
}

// heldCounts is how many workers of each of refs p places or lists as
// unplaced (-1: p does not say: none, invalid, or another shape).
func heldCounts(p *Plan, refs []elasticRef) []int {
	out := make([]int, len(refs))
	for k := range out {
		out[k] = -1
	}
	if p == nil || !p.Placed() {
		return out
	}
	var env []int
	for _, d := range p.Demands {
		if d.Component == plan.Env {
			env = append(env, d.Workers)
		}
	}
	for k, r := range refs {
		switch {
		case r.c == plan.Eval:
			for _, d := range p.Demands {
				if d.Component == plan.Eval {
					out[k] = d.Workers
				}
			}
		case r.gi < len(env) && len(env) == r.gi+1:
			first := 0
			for _, n := range env[:r.gi] {
				first += n
			}
			if first == r.first {
				out[k] = env[r.gi]
			}
		}
	}
	return out
}

// startCounts is the sizes a job is planned at first: what its
// previous plan holds, within the spec's range; the minimum without one.
func startCounts(j *Job, refs []elasticRef) []int {
	out := heldCounts(j.Prev, refs)
	for k, r := range refs {
		if out[k] < 0 {
			out[k] = r.min
		}
		out[k] = min(max(out[k], r.min), r.max)
	}
	return out
}

// truncated is prev without the workers of refs at counts or above
// (the highest indices), its pools' allocations and counts as its
// remaining workers have them, planned for spec (sized): what prev
// holds once shrunk. prev itself is not changed. From prev's state where
// it has one (cutFast), else (and with readAll) from every worker.
func truncated(prev *Plan, refs []elasticRef, counts []int, spec *Spec, readAll bool) *Plan {
	if prev == nil || !prev.Placed() {
		return prev
	}
	held := heldCounts(prev, refs)
	cut := false
	for k := range refs {
		cut = cut || held[k] > counts[k]
	}
	if !cut {
		return prev
	}
	if !readAll {
		if out := cutFast(prev, refs, counts, spec); out != nil {
			return out // made from prev's state: its nodes untouched
		}
	}
	drop := func(c plan.Component, i int) bool {
		for k, r := range refs {
			if r.c == c && held[k] > counts[k] && i >= r.first+counts[k] && i < r.first+held[k] {
				return true
			}
		}
		return false
	}
	out := *prev
	out.state, out.afresh, out.takenBy, out.releasedAs = nil, nil, nil, nil
	out.notesFrom = notesKept(prev, drop)
	// Made here and filled by remainingWorkers, not returned by it, so
	// that they stay off the heap.
	gpus, counted := map[cutKey][]int{}, map[cutKey][]int{}
	out.Workers = plan.NewWorkers(remainingWorkers(prev, spec, drop, gpus, counted))
	out.Unplaced = slices.DeleteFunc(slices.Clone(prev.Unplaced), func(u plan.Unplaced) bool { return drop(u.Component, u.Index) })
	out.Pools = cutPools(prev.Pools, refs, gpus, counted)
	out.Demands = demandsOf(spec)
	if prev.spec != nil {
		out.spec = spec
	}
	return &out
}

// cutKey is one component's share of one pool's node: what truncated
// rebuilds a node's allocations and counts from.
type cutKey struct {
	pool, node string
	c          plan.Component
}

// remainingWorkers is prev's workers that drop keeps, read from every
// worker (the slow path of truncated, where prev's state cannot say).
// gpus and counted gather, per key, the GPUs the kept workers hold and
// their counts per scheduling group (eval and env: train is never
// elastic), so that cutPools rebuilds each node from what is left on it.
func remainingWorkers(prev *Plan, spec *Spec, drop func(plan.Component, int) bool, gpus, counted map[cutKey][]int) []plan.Worker {
	var ws []plan.Worker
	for _, w := range prev.Workers.All() {
		if drop(w.Component, w.Index) {
			continue
		}
		ws = append(ws, *w)
		k := cutKey{w.Pool, w.NodeID, w.Component}
		gpus[k] = append(gpus[k], w.GPUs...)
		if w.Component == plan.Eval || w.Component == plan.Env {
			c := counted[k]
			gi := groupOf(spec, w.Component, w.Index)
			for len(c) <= gi {
				c = append(c, 0)
			}
			c[gi]++
			counted[k] = c
		}
	}
	return ws
}

// cutPools is pools with refs' allocations and worker counts as the
// kept workers have them (gpus, counted: remainingWorkers), each node copied
// so that prev's own pools are not changed; a node left holding nothing
// is left out: a plan's pools list the nodes it holds.
func cutPools(pools []plan.Pool, refs []elasticRef, gpus, counted map[cutKey][]int) []plan.Pool {
	out := make([]plan.Pool, len(pools))
	for i, pl := range pools {
		var nodes []plan.PoolNode
		for _, pn := range pl.Nodes.All() {
			nn := *pn
			nn.Allocations = make(map[plan.Component][]plan.Range, len(pn.Allocations))
			for c, rs := range pn.Allocations {
				nn.Allocations[c] = rs
			}
			nn.WorkerCounts = pn.WorkerCounts
			for _, r := range refs {
				k := cutKey{pl.Name, pn.NodeID, r.c}
				g := slices.Compact(slices.Sorted(slices.Values(gpus[k])))
				if len(g) == 0 {
					delete(nn.Allocations, r.c)
				} else {
					nn.Allocations[r.c] = plan.RangesOf(g)
				}
				if old := *pn.WorkerCounts.Of(r.c); old != nil {
					c := make([]int, len(old))
					copy(c, counted[k])
					*nn.WorkerCounts.Of(r.c) = c
				}
			}
			if len(nn.Allocations) == 0 && emptyCounts(nn.WorkerCounts) {
				continue
			}
			nodes = append(nodes, nn)
		}
		out[i] = plan.Pool{Name: pl.Name, Nodes: plan.NewPoolNodes(nodes)}
	}
	return out
}

// groupOf is the scheduling group of worker i of component c.
func groupOf(s *Spec, c plan.Component, i int) int {
	if c != plan.Env {
		return 0
	}
	first := 0
	for gi, g := range s.Scheduling.Env {
		if i < first+g.WorkerNum {
			return gi
		}
		first += g.WorkerNum
	}
	return max(len(s.Scheduling.Env)-1, 0)
}

func emptyCounts(g plan.GroupCounts) bool {
	for _, l := range [][]int{g.Train, g.Eval, g.Env} {
		for _, n := range l {
			if n > 0 {
				return false
			}
		}
	}
	return true
}

// ElasticOptions say how PlanAllWith grows elastic groups.
type ElasticOptions struct {
	// GrowInto reports whether an elastic group may grow onto GPU g of
	// node id, a GPU no plan holds (the service: one free long enough);
	// nil: onto any free GPU.
	GrowInto func(node string, g int) bool
	// NoGrow plans no growth at all: only minimums, and surplus given up
	// where others need it.
	NoGrow bool
	// readAll makes every trial of the search read every worker of the
	// plans it starts from, as from their documents, instead of starting
	// from their states at other sizes (resize.go): the same plans at a
	// cost in proportion to the cluster, kept as the tests' oracle.
	readAll bool
	// searchOnly always runs the search of trials, never the one trial
	// arithmetic sizes (direct): the tests' oracle for that shortcut.
	searchOnly bool
}

// elastic is one PlanAllWith run over jobs of which some are elastic.
type elastic struct {
	jobs  []Job
	nodes []Node
	refs  [][]elasticRef // per job (nil: fixed, or held as it is)
	start [][]int        // the sizes each job starts at
	a     *allocator
	// facts are what its allocators found of nodes, shared.
	facts *nodeFacts
	// rel is, per job, what its shrink gave up this run (grow.go).
	rel map[int]holding
	// readAll is ElasticOptions.readAll.
	readAll bool
	// from is, per job (where not nil), the plan every trial plans it
	// from in place of its own previous plan: where a second search
	// starts a plan new this run, or one that healed (search).
	from []*Plan
	// healed is, per job, whether from holds it as it healed (a plan
	// placed before whose trial re-placed workers a lost node or GPU
	// held) or as it was placed anew for a new spec: the second search
	// may shrink it (cut from where it went).
	healed []bool
}

// trial is one run of PlanAllWith's search: its outcomes, whose reasons
// why words (planTrial), once the trial is kept.
type trial struct {
	out []Outcome
	why func()
}

// PlanAllWith is PlanAll with elastic groups grown as opt says. With no
// elastic group among the jobs it is PlanAll exactly.
//
// Each elastic group is planned at the size its job's previous plan
// holds (within its range). When that leaves a plan worse off (invalid,
// preempted, degraded, its new spec pending) than it would be with every
// elastic group at its minimum, surplus workers are given up first, from
// the lowest priority upward (the youngest first among equals) and the
// highest index downward, as few as it takes (a binary search over that
// order). Then, GPUs no plan holds (and opt allows) are grown into:
// higher priorities first, equal priorities one worker each in turn,
// each growth adding workers with the next indices and moving no
// placed worker, within max_gpus.
func PlanAllWith(jobs []Job, nodes []Node, opt ElasticOptions) []Outcome {
	jobs = prevSpecsSized(jobs)
	el := &elastic{jobs: jobs, nodes: nodes, refs: make([][]elasticRef, len(jobs)), start: make([][]int, len(jobs)), readAll: opt.readAll,
		facts: &nodeFacts{nodes: nodes}}
	any := false
	for j := range jobs {
		if jobs[j].Spec == nil {
			continue
		}
		if r := elasticRefs(jobs[j].Spec); len(r) > 0 {
			el.refs[j], el.start[j], any = r, startCounts(&jobs[j], r), true
		}
	}
	if !any {
		return planRuns(jobs, nodes, opt.readAll)
	}
	sizes, kept := el.search(opt.searchOnly)
	var first []Outcome
	if from := el.healedFrom(kept.out, el.placedTakers(kept.out)); from != nil && el.surplus(sizes) > 0 && slices.ContainsFunc(kept.out, func(o Outcome) bool { return score(o) == 4 }) {
		// A plan left invalid beside surplus, where a plan new this run
		// was placed: the search's yardstick (every group at its minimum)
		// placed the new plan afresh there too, and may have cut up the
		// room the invalid one needs. The next run starts from where the
		// new plan went; so does a second search, kept where it places
		// the new plans as the first did and leaves every plan better
		// off or as well, so that the next run, on a quiet cluster, has
		// nothing left to do. Likewise where a plan healed (re-placed
		// workers a lost node held): the next run starts from where its
		// workers went, and the yardstick there may fit the invalid plan
		// in its surplus; the second search starts each healed plan at
		// the sizes it holds there and may shrink it.
		el.from, first = from, kept.out
		start := el.start
		el.start = el.startFrom(from)
		s2, k2 := el.search(true)
		el.start = start
		if el.improves(k2.out, first, from) {
			sizes, kept = s2, k2
			el.asFirst(kept.out, first)
		} else {
			el.from, el.healed = nil, nil
		}
	}
	kept.why()
	out := kept.out
	// A plan left invalid is planned at its minimum from now on (it
	// holds nothing to keep): say why at that size, as the next run will.
	// The run at the new sizes may leave another plan invalid that was
	// placed before, still at its larger size; the next run would word it
	// at its minimum, a new revision on a quiet cluster. So it is set to
	// its minimum too and the run repeated until no invalid plan is left
	// above its minimum: each round sets at least one group down, so it
	// ends within as many rounds as there are groups.
	for {
		atMin := false
		for j, rs := range el.refs {
			if rs == nil || out[j].Plan.Placed() {
				continue
			}
			for k, r := range rs {
				if sizes[j][k] != r.min {
					if !atMin {
						sizes = take(sizes, nil)
					}
					sizes[j][k], atMin = r.min, true
				}
			}
		}
		if !atMin {
			break
		}
		out = el.run(sizes)
		el.asFirst(out, first)
	}
	if !opt.NoGrow {
		sizes, out = el.grow(sizes, out, opt)
	}
	el.annotate(out, sizes)
	return out
}

// prevSpecsSized is jobs with each elastic PrevSpec sized to what its
// Prev holds (heldCounts, within the spec's range). A PrevSpec is a
// stored spec, its elastic groups at their minimum as parsed; the
// placement it stands for holds them at the sizes the document's
// demands say, and a run keeps that placement on it (placeJob: a spec
// pending), so that unsized it would cut a grown plan back to its
// minimum where a planner that kept running, whose plan knows the sized
// spec (Plan.spec), keeps every worker. jobs itself is not changed.
func prevSpecsSized(jobs []Job) []Job {
	out := jobs
	for j := range jobs {
		job := &jobs[j]
		refs := elasticRefs(job.PrevSpec)
		if len(refs) == 0 || job.Prev == nil || !job.Prev.Placed() {
			continue
		}
		at := clampTo(refs, heldCounts(job.Prev, refs))
		ps := sized(job.PrevSpec, at)
		if specEqual(ps, job.PrevSpec) {
			continue
		}
		if &out[0] == &jobs[0] {
			out = slices.Clone(jobs)
		}
		out[j].PrevSpec = ps
	}
	return out
}

// search sizes every elastic group for this run (PlanAllWith): the
// sizes and the trial at them, its reasons left to word. searchOnly:
// never the one trial arithmetic sizes (direct).
//
// Each run of the search is a trial, whose plans are worded (why) only
// if it is the one kept: how a plan fares (score) needs no words. The
// plans at their start sizes are kept unless one fares badly there
// (hurt), surplus could go, and they fare worse than at the yardstick
// (every elastic group at its minimum); then the fewest surplus units go
// that leave them no worse off than there (shrinkSearch).
func (el *elastic) search(searchOnly bool) ([][]int, trial) {
	if sizes, kept, ok := el.directSearch(searchOnly); ok {
		return sizes, kept
	}
	sizes := el.start
	kept := el.trial(sizes)
	if !el.hurt(kept.out) || el.surplus(sizes) <= 0 {
		return sizes, kept
	}
	// The yardstick's sizes, made here, not returned by a function, so
	// that the list stays off the heap.
	floor := make([][]int, len(el.jobs))
	for j, rs := range el.refs {
		for _, r := range rs {
			floor[j] = append(floor[j], r.min)
		}
	}
	baseRun := el.trial(floor)
	if !worse(kept.out, baseRun.out) {
		return sizes, kept
	}
	return el.shrinkSearch(sizes, baseRun)
}

// directSearch is the search where arithmetic alone says how much
// surplus must go (direct): the one trial at that size is the search's
// answer when every plan fares well there (ok); else the search runs as
// if it had not been tried. direct is asked even with searchOnly, as it
// was before this was a function of its own: it may make the run's
// allocator (el.allocator), and asking it only without searchOnly would
// change when that is made.
func (el *elastic) directSearch(searchOnly bool) (sizes [][]int, kept trial, ok bool) {
	sizes = el.start
	k, short, ok := el.direct(sizes)
	if !ok || searchOnly {
		return nil, trial{}, false
	}
	taken := el.firstUnits(sizes, k)
	o := el.trial(take(sizes, taken))
	if el.hurt(o.out) {
		return nil, trial{}, false
	}
	sizes, kept = take(sizes, taken), o
	// As the search does (shrinkSearch): a group whose surplus made no
	// difference keeps it, tried only where what the other units free
	// covers the takers' need.
	for _, g := range groupsOf(taken) {
		keep := slices.DeleteFunc(slices.Clone(taken), func(u shrinkUnit) bool { return u == g })
		if el.unitGPUs(keep) < short {
			continue
		}
		if o := el.trial(take(el.start, keep)); !el.hurt(o.out) {
			taken, sizes, kept = keep, take(el.start, keep), o
		}
	}
	return sizes, kept, true
}

// shrinkSearch gives up the fewest surplus units, in their order, that
// leave no plan worse off than at the yardstick (baseRun): a binary
// search from a first guess. The order gives up every lower plan's
// surplus (and each plan's last group's) before the next; a group whose
// surplus made no difference (the room needed was another's) keeps it.
func (el *elastic) shrinkSearch(sizes [][]int, baseRun trial) ([][]int, trial) {
	base := baseRun.out
	units := el.units(sizes)
	lo, hi, best := el.guessBounds(sizes, units, baseRun)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if o := el.trial(take(sizes, units[:mid])); worse(o.out, base) {
			lo = mid
		} else {
			hi, best = mid, o
		}
	}
	taken := units[:hi]
	sizes, kept := take(sizes, taken), best
	for _, g := range groupsOf(taken) {
		keep := slices.DeleteFunc(slices.Clone(taken), func(u shrinkUnit) bool { return u == g })
		if o := el.trial(take(el.start, keep)); !worse(o.out, base) {
			taken, sizes, kept = keep, take(el.start, keep), o
		}
	}
	return sizes, kept
}

// guessBounds is shrinkSearch's first bounds on how many units must go,
// and the trial at hi: from a first guess from the GPUs the yardstick
// (baseRun) leaves free, and the one below it, so that where the guess
// is right the search takes one or two runs.
func (el *elastic) guessBounds(sizes [][]int, units []shrinkUnit, baseRun trial) (lo, hi int, best trial) {
	base := baseRun.out
	lo, hi, best = 0, len(units), baseRun
	k, exact := el.guess(units, base)
	if k >= hi {
		return lo, hi, best
	}
	o := el.trial(take(sizes, units[:k]))
	if worse(o.out, base) {
		return k, hi, best
	}
	hi, best = k, o
	switch {
	case exact:
		// Whole GPUs, each counted: one unit fewer frees fewer GPUs
		// than the plans lack.
		lo = k - 1
	case k > 1:
		if o := el.trial(take(sizes, units[:k-1])); worse(o.out, base) {
			lo = k - 1
		} else {
			hi, best = k-1, o
		}
	}
	return lo, hi, best
}

// run plans every job with its elastic groups at sizes, each previous
// plan cut to them.
func (el *elastic) run(sizes [][]int) []Outcome { return el.runFrom(sizes, nil) }

// runFrom is run with the previous plans of from (where not nil) in
// place of the jobs' own: this run's plans, some grown.
func (el *elastic) runFrom(sizes [][]int, from []*Plan) []Outcome {
	t := el.trialFrom(sizes, from)
	t.why()
	return t.out
}

// trial is run, its reasons left to word.
func (el *elastic) trial(sizes [][]int) trial { return el.trialFrom(sizes, nil) }

// trialFrom is runFrom, its reasons left to word.
func (el *elastic) trialFrom(sizes [][]int, from []*Plan) trial {
	healed := el.healed // only a second search's own plans are cut
	if from == nil {
		from = el.from
	} else {
		healed = nil
	}
	jobs := make([]Job, len(el.jobs))
	copy(jobs, el.jobs)
	for j := range jobs {
		job := &jobs[j]
		if from != nil && from[j] != nil {
			job.Prev, job.PrevSpec = from[j], nil
			if el.refs[j] != nil {
				job.Spec = sized(job.Spec, sizes[j])
				if j < len(healed) && healed[j] {
					job.Prev = truncated(from[j], el.refs[j], sizes[j], job.Spec, el.readAll)
				}
			}
			continue
		}
		if el.refs[j] == nil {
			continue
		}
		cutTo(job, el.refs[j], sizes[j], el.readAll)
	}
	out, why := planTrial(jobs, el.nodes, el.readAll, el.facts)
	return trial{out, why}
}

// cutTo sets job's elastic groups (refs) to sizes: its spec sized, and
// its previous placement cut to them where it follows this very spec
// but for its sizes; one made for another spec is left to PlanAll's
// rules for a spec change.
func cutTo(job *Job, refs []elasticRef, sizes []int, readAll bool) {
	orig := job.Spec
	job.Spec = sized(job.Spec, sizes)
	ps := job.PrevSpec
	if ps == nil && job.Prev != nil {
		ps = job.Prev.spec
	}
	switch {
	case ps != nil && sameShape(elasticRefs(ps), refs):
		at := clampTo(elasticRefs(ps), sizes)
		cut := truncated(job.Prev, elasticRefs(ps), at, sized(ps, at), readAll)
		if job.PrevSpec != nil && cut != job.Prev {
			// As truncated sizes the spec a plan knows: only where it cut
			// the plan. Sized above what the plan holds, the spec kept in
			// force for a spec pending would place more workers on it, a
			// growth no grow-after allowed, that a planner which kept
			// running (its plan's own spec) does not make.
			job.PrevSpec = sized(ps, at)
		}
		job.Prev = cut
	case ps == nil && job.Prev != nil && slices.Equal(job.Prev.Demands, demandsOf(sized(orig, heldCounts(job.Prev, refs)))):
		job.Prev = truncated(job.Prev, refs, sizes, job.Spec, readAll)
	}
}

// sameShape reports whether two specs' elastic groups are the same
// groups (their ranges may differ).
func sameShape(a, b []elasticRef) bool {
	return slices.EqualFunc(a, b, func(x, y elasticRef) bool { return x.c == y.c && x.gi == y.gi && x.first == y.first })
}

func clampTo(refs []elasticRef, counts []int) []int {
	out := make([]int, len(refs))
	for k, r := range refs {
		out[k] = min(max(counts[k], r.min), r.max)
	}
	return out
}

// placedTakers is, per job, its plan in out where out places it anew:
// it holds nothing going in, or its placement follows another spec (not
// merely other sizes) and out places the new one (nil: none such).
func (el *elastic) placedTakers(out []Outcome) []*Plan {
	var from []*Plan
	for j := range out {
		job := &el.jobs[j]
		switch p := out[j].Plan; {
		case job.Spec == nil || !p.Placed():
			continue
		case job.Prev != nil && job.Prev.Placed() && (!el.respecced(j) || !p.Valid() || p.PendingSpec != nil):
			continue
		}
		if from == nil {
			from = make([]*Plan, len(out))
		}
		from[j] = out[j].Plan
	}
	return from
}

// healedFrom is from (placedTakers) with, where some plan of out
// healed, that plan too (el.healed set): valid, its spec unchanged, and
// some of its workers re-placed because their node or GPU went. nil where from is nil and none healed.
func (el *elastic) healedFrom(out []Outcome, from []*Plan) []*Plan {
	for j := range out {
		job, o := &el.jobs[j], out[j]
		if from != nil && from[j] != nil && el.refs[j] != nil && job.Prev != nil && job.Prev.Placed() {
			// Placed anew for a new spec: the next run starts from where
			// it went and may shrink it there, as a healed plan.
			if el.healed == nil {
				el.healed = make([]bool, len(out))
			}
			el.healed[j] = true
		}
		if from != nil && from[j] != nil || job.Spec == nil || job.Prev == nil || !job.Prev.Placed() || el.respecced(j) ||
			!o.Plan.Valid() || o.Plan.PendingSpec != nil || o.Change == nil || o.Change.Fresh || !slices.ContainsFunc(o.Change.Displaced, lostPlace) {
			continue
		}
		if from == nil {
			from = make([]*Plan, len(out))
		}
		if el.healed == nil {
			el.healed = make([]bool, len(out))
		}
		from[j], el.healed[j] = o.Plan, true
	}
	return from
}

// lostPlace reports whether d was re-placed because its node or GPU
// went (left, gone, replaced, unhealthy, drained): a heal, not a move
// for another plan or a spec.
func lostPlace(d Displaced) bool {
	switch d.Why {
	case WhyNodeLeft, WhyGPUGone, WhyGPUReplaced, WhyUnhealthy, WhyDrained:
		return true
	}
	return false
}

// startFrom is the sizes a second search from from starts at: each
// healed plan's as it holds them there (its surplus may have gone to
// its heal), every other job's as the first search started it.
func (el *elastic) startFrom(from []*Plan) [][]int {
	out := slices.Clone(el.start)
	for j, p := range from {
		if p == nil || j >= len(el.healed) || !el.healed[j] || el.refs[j] == nil {
			continue
		}
		held := heldCounts(p, el.refs[j])
		out[j] = slices.Clone(el.start[j])
		for k, r := range el.refs[j] {
			if held[k] >= 0 {
				out[j][k] = min(max(held[k], r.min), out[j][k])
			}
		}
	}
	return out
}

// respecced reports whether job j's previous placement follows a spec
// other than its own beyond its elastic groups' sizes (a spec change),
// so that its run places it anew, as a fresh plan is, not from its
// placement cut to new sizes. A placement whose spec is not known
// (placeSpec) is held as it is: not anew.
func (el *elastic) respecced(j int) bool {
	job := &el.jobs[j]
	ps := job.placeSpec()
	if ps == nil {
		return false
	}
	refs := el.refs[j]
	if refs == nil {
		return !specEqual(ps, job.Spec)
	}
	held := heldCounts(job.Prev, refs)
	if !sameShape(elasticRefs(ps), refs) || slices.Contains(held, -1) {
		return true
	}
	return !specEqual(unranged(ps, held), unranged(job.Spec, held))
}

// unranged is spec sized to counts with its elastic groups' ranges
// left out: a range changed alone is not a spec change here, as cutTo
// plans it from the previous placement cut to size.
func unranged(s *Spec, counts []int) *Spec {
	out := *sized(s, counts)
	if out.Scheduling.Eval.Elastic() {
		g := *out.Scheduling.Eval
		g.Min, g.Max = 0, 0
		out.Scheduling.Eval = &g
	}
	out.Scheduling.Env = slices.Clone(out.Scheduling.Env)
	for i := range out.Scheduling.Env {
		out.Scheduling.Env[i].Min, out.Scheduling.Env[i].Max = 0, 0
	}
	return &out
}

// improves reports whether out (a search from the plans of from) does
// better than first: every plan of from placed as it was there, and the
// first job (in placing order) that fares otherwise better off.
func (el *elastic) improves(out, first []Outcome, from []*Plan) bool {
	for j := range out {
		if p := from[j]; p != nil {
			q := out[j].Plan
			switch {
			case j < len(el.healed) && el.healed[j]:
				// A healed plan may shrink: every worker it keeps
				// stays where it went.
				if !q.Valid() || !keepsAll(q, p) {
					return false
				}
			case !q.Valid() || q.Workers.Len() != p.Workers.Len() || !keepsAll(p, q):
				return false
			}
		}
	}
	// In placing order (priority, then age), as the core decides: the
	// first plan that fares otherwise says which does better. A plan
	// placed later may fare worse where one placed before it is placed
	// instead: the next run, from these plans, preempts it so.
	el.allocator()
	for _, j := range el.a.order {
		switch a, b := score(out[j]), score(first[j]); {
		case a > b:
			return false
		case a < b:
			return true
		}
	}
	return false
}

// asFirst puts back, in out (a run from el.from), the first search's
// outcome of each plan placed there as it was: a plan new this run,
// whose change is its first placement, not one from where it went.
//
// A healed plan the second search shrank keeps that search's plan, but
// its change is the first's (the workers it re-placed, from its own
// previous plan), less the workers it gave up.
func (el *elastic) asFirst(out, first []Outcome) {
	for j, p := range el.from {
		q := out[j].Plan
		switch {
		case p != nil && q.Valid() && q.Workers.Len() == p.Workers.Len() && keepsAll(p, q):
			out[j] = first[j]
		case p != nil && j < len(el.healed) && el.healed[j] && q.Valid() && keepsAll(q, p) && first[j].Change != nil:
			ch := *first[j].Change
			ch.Displaced = slices.DeleteFunc(slices.Clone(ch.Displaced), func(d Displaced) bool { return q.Workers.Find(d.Component, d.Index) == nil })
			out[j].Change = &ch
		}
	}
}

// hurt reports whether some job fares worse than valid and in place.
func (el *elastic) hurt(out []Outcome) bool {
	for j := range out {
		if el.jobs[j].Spec != nil && score(out[j]) > 0 {
			return true
		}
	}
	return false
}

// score ranks how a job fares: 0 valid and in place, 1 valid but moved
// by a preemption, 2 its new spec pending, 3 degraded, 4 invalid.
func score(o Outcome) int {
	switch p := o.Plan; {
	case p.PlanState() == plan.StateInvalid:
		return 4
	case p.PlanState() == plan.StateDegraded:
		return 3
	case p.PendingSpec != nil:
		return 2
	case len(p.PreemptedBy) > 0:
		return 1
	}
	return 0
}

// worse reports whether some job fares worse in out than in base.
func worse(out, base []Outcome) bool {
	for j := range out {
		if score(out[j]) > score(base[j]) {
			return true
		}
	}
	return false
}

func (el *elastic) surplus(sizes [][]int) int {
	n := 0
	for j, rs := range el.refs {
		for k, r := range rs {
			n += sizes[j][k] - r.min
		}
	}
	return n
}

// shrinkUnit is one worker given up: job j's elastic group k.
type shrinkUnit struct{ j, k int }

// units is the order surplus is given up in: the lowest priority first,
// the youngest first among equals, each job's last elastic group first,
// one worker per unit (the highest index first).
func (el *elastic) units(sizes [][]int) []shrinkUnit {
	// One unit per surplus worker: 119,000 of them for a plan grown over
	// a cluster, in one allocation.
	return el.firstUnits(sizes, el.surplus(sizes))
}

// firstUnits is the first k of units(sizes) (all where there are fewer):
// a shrink by arithmetic (direct) lists only the units it gives up.
func (el *elastic) firstUnits(sizes [][]int, k int) []shrinkUnit {
	out := make([]shrinkUnit, 0, k)
	el.eachUnit(sizes, func(u shrinkUnit) bool {
		if len(out) == k {
			return false
		}
		out = append(out, u)
		return true
	})
	return out
}

// eachUnit calls fn for each of units(sizes) in order, until fn says
// stop.
func (el *elastic) eachUnit(sizes [][]int, fn func(shrinkUnit) bool) {
	var order []int
	for j := range el.jobs {
		if el.refs[j] != nil {
			order = append(order, j)
		}
	}
	slices.SortStableFunc(order, func(x, y int) int {
		jx, jy := &el.jobs[x], &el.jobs[y]
		return cmp.Or(cmp.Compare(jx.priority(), jy.priority()), cmp.Compare(jy.Age, jx.Age), strings.Compare(jy.Name, jx.Name))
	})
	for _, j := range order {
		for k := len(el.refs[j]) - 1; k >= 0; k-- {
			for range sizes[j][k] - el.refs[j][k].min {
				if !fn(shrinkUnit{j, k}) {
					return
				}
			}
		}
	}
}

// take is sizes less the units given up.
func take(sizes [][]int, units []shrinkUnit) [][]int {
	out := make([][]int, len(sizes))
	for j := range sizes {
		out[j] = slices.Clone(sizes[j])
	}
	for _, u := range units {
		out[u.j][u.k]--
	}
	return out
}

// guess is how many of units to give up for every plan to fare as in
// base (every elastic group at its minimum): the surplus must fit in
// what base leaves free, so the units' GPUs beyond that are counted off
// in order (at least one unit). exact: every unit takes whole GPUs that
// no other component shares (colocated), every plan takes whole GPUs of
// its own (ownWholeGPUs), and the count came out even, so that one unit
// fewer cannot fit.
func (el *elastic) guess(units []shrinkUnit, base []Outcome) (k int, exact bool) {
	el.allocator()
	st := &growState{holds: make([]holding, len(base))}
	for j := range base {
		st.holds[j] = el.a.holdingOf(base[j].Plan)
	}
	// The surplus's GPUs are counted exactly only where every unit takes
	// whole GPUs of its own: a share of a GPU may fit beside the group's
	// other workers on a GPU it holds at its minimum, and so need no free
	// GPU at all.
	need, exactNeed := 0.0, true
	for i, u := range units {
		g := groupGPUs(el.jobs[u.j].Spec, el.refs[u.j][u.k])
		need += g
		if i == 0 || u != units[i-1] { // units come by group: each group once
			exactNeed = exactNeed && g >= 1 && g == math.Trunc(g) && !colocated(el.jobs[u.j].Spec)
		}
	}
	// So is the room: base's free GPUs are all there is only where
	// every plan takes whole GPUs of its own. A share, or a component
	// that may be colocated, can take a GPU of its own in base, where
	// room is left, and sit beside its plan's others where there is less
	// (env under device-colocate on its eval's GPUs), freeing one more.
	for j := range el.jobs {
		if s := el.jobs[j].Spec; s != nil && !ownWholeGPUs(s) {
			exactNeed = false
		}
	}
	el.eachFree(st, func(string, int) bool {
		need--
		return true
	})
	whole := exactNeed
	for k < len(units) && (need > 0 || k == 0) {
		u := units[k]
		g := groupGPUs(el.jobs[u.j].Spec, el.refs[u.j][u.k])
		whole = whole && g >= 1 && g == math.Trunc(g) && !colocated(el.jobs[u.j].Spec)
		need -= g
		k++
	}
	return k, whole && need == 0 && k > 1
}

// ownWholeGPUs reports whether every component of spec asks for whole
// GPUs (or none) and none may share a GPU with another (colocated): its
// plan takes as many GPUs however it is laid out.
func ownWholeGPUs(s *Spec) bool {
	if colocated(s) {
		return false
	}
	whole := func(g *WorkerGroup) bool { return g == nil || g.NumGPUs == math.Trunc(g.NumGPUs) }
	sc := &s.Scheduling
	if !whole(sc.Train) || !whole(sc.Eval) || !whole(sc.Buffer) {
		return false
	}
	for i := range sc.Env {
		if !whole(&sc.Env[i]) {
			return false
		}
	}
	return true
}

// direct is how many of the units of sizes to give up, by arithmetic
// alone, for the plans that hold nothing yet (takers) to fit (short: the
// GPUs they need beyond those free, which the units must free): the GPUs
// their specs need (the capacity arithmetic every plan is checked by)
// beyond the GPUs no previous plan holds, counted off the units in
// order. ok only where that count is the search's own answer once its
// trial places every plan well: every other plan holds its previous
// placement, valid, for its spec unchanged, so that the as-is trial
// would leave a taker short; every unit frees whole GPUs that no other
// component shares (no colocation), so that one unit fewer leaves a
// taker short too (and so does keeping any group's surplus, which gives
// up fewer units still).
func (el *elastic) direct(sizes [][]int) (k int, short float64, ok bool) {
	// The takers' need first: a run with none (most runs) stops here.
	need := 0.0
	for j := range el.jobs {
		job := &el.jobs[j]
		if job.Spec == nil || job.Prev != nil && job.Prev.Placed() {
			continue
		}
		spec := job.Spec
		if el.refs[j] != nil {
			spec = sized(spec, sizes[j])
		}
		e := newEngine(spec, Options{})
		if e.rules.manual || spec.MaxGPUs > 0 && e.required() > float64(spec.MaxGPUs) {
			return 0, 0, false // placed by hand, or never within its quota
		}
		need += e.required()
	}
	if need <= 0 {
		return 0, 0, false
	}
	for j := range el.jobs {
		job := &el.jobs[j]
		p := job.Prev
		if job.Spec == nil || p == nil || !p.Placed() {
			continue // held as it is, or a taker
		}
		if p.PlanState() != plan.StateValid || p.PendingSpec != nil || len(p.PreemptedBy) > 0 || len(p.Unplaced) > 0 {
			return 0, 0, false
		}
		ps := job.placeSpec()
		switch {
		case ps == nil:
			return 0, 0, false
		case el.refs[j] == nil && !specEqual(ps, job.Spec):
			return 0, 0, false
		case el.refs[j] != nil:
			if colocated(job.Spec) {
				return 0, 0, false
			}
			held := heldCounts(p, el.refs[j])
			if !sameShape(elasticRefs(ps), el.refs[j]) || !slices.Equal(held, sizes[j]) || !specEqual(sized(ps, held), sized(job.Spec, held)) {
				return 0, 0, false
			}
		}
	}
	el.allocator()
	st := &growState{holds: make([]holding, len(el.jobs))}
	for j := range el.jobs {
		st.holds[j] = el.a.holdingOf(el.jobs[j].Prev)
	}
	el.eachFree(st, func(string, int) bool {
		need--
		return need > 0
	})
	if need <= 0 {
		return 0, 0, false // room enough as it is, as far as arithmetic knows
	}
	short, whole := need, true
	el.eachUnit(sizes, func(u shrinkUnit) bool {
		g := groupGPUs(el.jobs[u.j].Spec, el.refs[u.j][u.k])
		whole = whole && g >= 1 && g == math.Trunc(g)
		need -= g
		k++
		return whole && need > 0
	})
	return k, short, whole && need <= 0
}

// colocated reports whether spec's components may share GPUs (colocate,
// device-colocate): an elastic worker given up there may leave its GPUs
// to another component of its plan, freeing none, so that counting the
// GPUs workers ask for overstates what a shrink frees.
func colocated(s *Spec) bool {
	r := newRules(s.Placement)
	return r.colocate || r.deviceColocate
}

// unitGPUs is the GPUs units' workers ask for.
func (el *elastic) unitGPUs(units []shrinkUnit) float64 {
	n := 0.0
	for _, u := range units {
		n += groupGPUs(el.jobs[u.j].Spec, el.refs[u.j][u.k])
	}
	return n
}

// groupsOf is the groups of units, in order, but the group of the last
// (the one the search stopped in).
func groupsOf(units []shrinkUnit) []shrinkUnit {
	var out []shrinkUnit
	for _, u := range units {
		if u != units[len(units)-1] && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}
