package planner

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Why a worker of the previous plan cannot keep its place. Tests assert on
// these prefixes; Change.Summary prints them.
const (
	WhyNew         = "new worker"
	WhyNodeLeft    = "node left"
	WhyGPUGone     = "GPU gone"
	WhyGPUReplaced = "GPU replaced"
	WhyUnhealthy   = "GPU unhealthy"
	WhyCPUs        = "CPUs exhausted"
	WhyNeeds       = "needs changed"
	WhyConflict    = "GPU taken"
)

// Displaced is a worker of the previous plan that had to be placed again.
type Displaced struct {
	Component Component
	Index     int
	// NodeID is where it was; empty for a new worker.
	NodeID string
	Why    string
}

// Change says how Replan arrived at its plan.
type Change struct {
	// Fresh is set when the plan is the core's fresh plan (Compute), and
	// FreshWhy says why sticky replanning was not used.
	Fresh    bool
	FreshWhy string
	// Displaced lists the workers that were placed again; only for a
	// sticky plan.
	Displaced []Displaced
}

// Summary is the change in one line for a plan's reason: "fresh plan:
// ..." or "re-placed 3 workers (train 0-1: node left n2; eval 0: GPU
// unhealthy n1:3)"; empty when nothing was displaced.
func (c *Change) Summary() string {
	if c == nil {
		return ""
	}
	if c.Fresh {
		return "fresh plan: " + c.FreshWhy
	}
	if len(c.Displaced) == 0 {
		return ""
	}
	// Group indices by component and cause, in first-seen order.
	type group struct {
		comp Component
		why  string
		idx  []int
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, d := range c.Displaced {
		why := d.Why
		if d.NodeID != "" && !strings.Contains(why, " ") {
			why += " " + d.NodeID
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
	parts := make([]string, len(groups))
	for i, g := range groups {
		sort.Ints(g.idx)
		parts[i] = fmt.Sprintf("%s %s: %s", g.comp, FormatRanges(rangesOf(g.idx)), g.why)
	}
	return fmt.Sprintf("re-placed %d %s (%s)", len(c.Displaced), plural(len(c.Displaced), "worker", "workers"), strings.Join(parts, "; "))
}

// Replan plans spec on nodes moving as few workers of prev as it can:
// a worker whose node, GPUs and CPUs are all still there and usable keeps
// them, and only the displaced ones are placed again, onto free capacity,
// under the same sharing rules as Compute. A node joining therefore moves
// nobody. Where sticky replanning does not apply (no valid previous plan,
// another placement, manual mode, buffers that hold GPUs) or cannot place
// every worker, Replan returns Compute's fresh plan and says why in the
// Change. Moved is set on the plan in both cases. Like Compute it always
// returns a document and, when no valid plan exists, the error too.
func Replan(prev *Plan, spec *Spec, nodes []Node) (*Plan, *Change, error) {
	if why := freshWhy(prev, spec); why != "" {
		return fresh(prev, spec, nodes, why)
	}
	s := newSticky(spec, nodes)
	prevBy := indexWorkers(prev.Workers)
	ch := &Change{}
	var displaced []need
	for _, n := range s.needs {
		pw := prevBy.get(n.comp, n.index)
		if pw == nil {
			ch.Displaced = append(ch.Displaced, Displaced{n.comp, n.index, "", WhyNew})
			displaced = append(displaced, n)
			continue
		}
		if why := s.keep(pw, n); why != "" {
			ch.Displaced = append(ch.Displaced, Displaced{n.comp, n.index, pw.NodeID, why})
			displaced = append(displaced, n)
		}
	}
	for _, n := range displaced {
		if why := s.place(n); why != "" {
			return fresh(prev, spec, nodes, fmt.Sprintf("sticky replan could not place %s %d (%s)", n.comp, n.index, why))
		}
	}
	doc := s.document(prev)
	doc.Valid = true
	doc.Moved = CountMoved(prev, doc)
	return doc, ch, nil
}

// CountMoved counts the workers of next that are not where prev had them
// (same component and index on the same node and GPUs); workers new in
// next count as moved.
func CountMoved(prev, next *Plan) int {
	if next == nil {
		return 0
	}
	var old *workerIndex
	if prev != nil {
		old = indexWorkers(prev.Workers)
	}
	moved := 0
	for i := range next.Workers {
		w := &next.Workers[i]
		o := old.get(w.Component, w.Index)
		if o == nil || o.NodeID != w.NodeID || !equalInts(o.GPUs, w.GPUs) {
			moved++
		}
	}
	return moved
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func fresh(prev *Plan, spec *Spec, nodes []Node, why string) (*Plan, *Change, error) {
	doc, err := Compute(spec, nodes)
	doc.Moved = CountMoved(prev, doc)
	return doc, &Change{Fresh: true, FreshWhy: why}, err
}

// freshWhy says why prev cannot be the base of a sticky plan for spec,
// or "" when it can.
func freshWhy(prev *Plan, spec *Spec) string {
	sp := spec.Placement
	switch {
	case prev == nil:
		return "first plan"
	case !prev.Valid:
		return "the previous plan was not valid"
	case sp.Mode != ModeAuto:
		return "manual placement is fixed by the spec"
	case prev.Mode != sp.Mode || prev.Strategy != sp.Strategy || prev.EnvStrategy != sp.EnvStrategy:
		return "placement changed"
	}
	if bf := spec.Scheduling.Buffer; bf != nil && bf.NumGPUs > 0 && spec.Scheduling.Train != nil && spec.Scheduling.Train.WorkerNum > 0 {
		// Their GPUs are a reserve at the end of the train range, which
		// only the core lays out.
		return "buffer workers hold GPUs"
	}
	return ""
}

// workerIndex finds a plan's workers by component and index: Replan and
// CountMoved look up every worker, and hashing strings for each cost
// more than the rest of a replan.
type workerIndex [4][]*Worker

func indexWorkers(ws []Worker) *workerIndex {
	var x workerIndex
	for i := range ws {
		w := &ws[i]
		k := w.Component.Rank()
		if k < 0 || w.Index < 0 {
			continue
		}
		for len(x[k]) <= w.Index {
			x[k] = append(x[k], nil)
		}
		x[k][w.Index] = w
	}
	return &x
}

func (x *workerIndex) get(c Component, i int) *Worker {
	k := c.Rank()
	if x == nil || k < 0 || i < 0 || i >= len(x[k]) {
		return nil
	}
	return x[k][i]
}

// need is one worker the spec asks for.
type need struct {
	comp  Component
	ci    int
	index int
	group WorkerGroup
}

// gpuCount is how many GPUs the worker holds, and frac its share of each.
func (n need) gpus() (count int, frac float64) {
	switch g := n.group.NumGPUs; {
	case g <= 0:
		return 0, 0
	case g <= 1:
		return 1, g
	default:
		return int(math.Round(g)), 1
	}
}

// stickyNode is a node during a sticky replan: what each component holds
// of each GPU and the CPUs left.
type stickyNode struct {
	node     *Node
	rank     int
	healthy  []bool
	share    [len(gpuComponents)][]float64
	cpuLeft  float64
	hasTrain bool
	// firstTrain orders buffer nodes as the core does: by their lowest
	// train worker index.
	firstTrain int
}

type sticky struct {
	spec  *Spec
	all   []Node
	nodes []*stickyNode
	byID  map[string]*stickyNode
	// byRank is the nodes in the core's visiting order.
	byRank []*stickyNode
	needs  []need
	// placed holds worker n at base[n.ci]+n.index, so the document needs
	// no sorting.
	placed []Worker
	base   [len(gpuComponents)]int
	// bufferCPUs is reserved with a node's first train worker.
	bufferCPUs float64
	hasBuffer  bool
	notes      notes
}

func newSticky(spec *Spec, nodes []Node) *sticky {
	s := &sticky{spec: spec, all: nodes, byID: make(map[string]*stickyNode, len(nodes))}
	states := make([]*nodeState, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		sn := &stickyNode{node: n, cpuLeft: n.CPUs, healthy: make([]bool, n.GPUs), firstTrain: -1}
		for g := range sn.healthy {
			sn.healthy[g] = true
		}
		for _, u := range n.Unhealthy {
			if u >= 0 && u < n.GPUs {
				sn.healthy[u] = false
			}
		}
		if len(n.Unhealthy) > 0 {
			s.notes.add(n.ID, "", ReasonUnhealthyGPU)
		}
		for ci := range sn.share {
			sn.share[ci] = make([]float64, n.GPUs)
		}
		s.nodes = append(s.nodes, sn)
		s.byID[n.ID] = sn
		states[i] = newNodeState(n)
	}
	sortNodes(states)
	s.byRank = make([]*stickyNode, len(states))
	for r, st := range states {
		sn := s.byID[st.node.ID]
		sn.rank = r
		s.byRank[r] = sn
	}
	sc := spec.Scheduling
	for ci, groups := range [][]WorkerGroup{groupList(sc.Train), groupList(sc.Eval), sc.Env} {
		s.base[ci] = len(s.needs)
		idx := 0
		for _, g := range groups {
			for range max(g.WorkerNum, 0) {
				s.needs = append(s.needs, need{gpuComponents[ci], ci, idx, g})
				idx++
			}
		}
	}
	s.placed = make([]Worker, len(s.needs))
	if sc.Buffer != nil && sc.Train != nil && sc.Train.WorkerNum > 0 {
		s.hasBuffer = true
		s.bufferCPUs = sc.Buffer.NumCPUs
	}
	return s
}

// conflicts reports whether components ci and cj may not share a GPU:
// disaggregate keeps train apart from rollout; eval and env share only
// under device-colocate.
func (s *sticky) conflicts(ci, cj int) bool {
	if ci == cj {
		return false
	}
	if ci == 0 || cj == 0 {
		return s.spec.Placement.Strategy != StrategyColocate
	}
	return s.spec.Placement.EnvStrategy != EnvStrategyDeviceColocate
}

// fits says why component ci cannot take frac of GPU g of sn, or "".
func (s *sticky) fits(sn *stickyNode, ci, g int, frac float64) string {
	if g < 0 || g >= len(sn.healthy) {
		return WhyGPUGone
	}
	if !sn.healthy[g] {
		return WhyUnhealthy
	}
	if sn.share[ci][g]+frac > 1+eps {
		return WhyConflict
	}
	for cj := range sn.share {
		if s.conflicts(ci, cj) && sn.share[cj][g] > eps {
			return WhyConflict
		}
	}
	return ""
}

// cpusFor is what placing n on sn costs in CPUs: a node's first train
// worker also brings the node's buffer worker.
func (s *sticky) cpusFor(sn *stickyNode, n need) float64 {
	c := n.group.NumCPUs
	if n.ci == 0 && s.hasBuffer && !sn.hasTrain {
		c += s.bufferCPUs
	}
	return c
}

// keep gives n the place pw had, or says why it cannot.
func (s *sticky) keep(pw *Worker, n need) string {
	sn := s.byID[pw.NodeID]
	if sn == nil {
		return WhyNodeLeft + " " + pw.NodeID
	}
	count, frac := n.gpus()
	if len(pw.GPUs) != count || math.Abs(pw.CPUs-n.group.NumCPUs) > eps || (count > 0 && math.Abs(pw.GPUShare-frac) > eps) {
		return WhyNeeds
	}
	for i, g := range pw.GPUs {
		if why := s.fits(sn, n.ci, g, frac); why != "" {
			return fmt.Sprintf("%s %s:%d", why, sn.node.ID, g)
		}
		// A GPU swapped for another in the same slot is not the GPU the
		// worker was told about.
		if i < len(pw.GPUUUIDs) && len(sn.node.GPUUUIDs) == sn.node.GPUs && sn.node.GPUUUIDs[g] != pw.GPUUUIDs[i] {
			return fmt.Sprintf("%s %s:%d", WhyGPUReplaced, sn.node.ID, g)
		}
	}
	if cpus := s.cpusFor(sn, n); cpus > sn.cpuLeft+eps {
		return WhyCPUs + " " + sn.node.ID
	}
	// The previous plan is not changed after it is made, so a worker that
	// stays shares its GPU lists.
	s.take(sn, n, pw.GPUs, pw.GPUUUIDs, frac)
	return ""
}

// take records n on sn holding gpus; uuids, when given, are theirs.
func (s *sticky) take(sn *stickyNode, n need, gpus []int, uuids []string, frac float64) {
	sn.cpuLeft -= s.cpusFor(sn, n)
	for _, g := range gpus {
		sn.share[n.ci][g] += frac
	}
	if n.ci == 0 {
		sn.hasTrain = true
		if sn.firstTrain < 0 || n.index < sn.firstTrain {
			sn.firstTrain = n.index
		}
	}
	w := Worker{Component: n.comp, Index: n.index, Pool: s.poolOf(n.ci), NodeID: sn.node.ID, IP: sn.node.IP, CPUs: n.group.NumCPUs}
	if len(gpus) > 0 {
		w.GPUs = gpus
		w.GPUShare = frac
		if len(sn.node.GPUUUIDs) == sn.node.GPUs {
			if len(uuids) == len(gpus) {
				w.GPUUUIDs = uuids
			} else {
				for _, g := range gpus {
					w.GPUUUIDs = append(w.GPUUUIDs, sn.node.GPUUUIDs[g])
				}
			}
		}
	}
	s.placed[s.base[n.ci]+n.index] = w
}

func (s *sticky) poolOf(ci int) string {
	if s.spec.Placement.Strategy == StrategyColocate {
		return GlobalPool
	}
	if ci == 0 {
		return TrainPool
	}
	return RolloutPool
}

// place puts a displaced worker on free capacity: first on nodes where its
// component already holds GPUs, so pools do not spread, then on the rest
// in the core's node order. It says why it failed, or "".
func (s *sticky) place(n need) string {
	count, frac := n.gpus()
	// home: the component is there already; clean: nothing it must keep
	// apart from is there; mixed: the rest.
	var home, clean, mixed []*stickyNode
	for _, sn := range s.byRank {
		switch {
		case s.holds(sn, n.ci):
			home = append(home, sn)
		case s.apart(sn, n.ci):
			mixed = append(mixed, sn)
		default:
			clean = append(clean, sn)
		}
	}
	cpuShort := false
	for _, sn := range slices.Concat(home, clean, mixed) {
		if s.cpusFor(sn, n) > sn.cpuLeft+eps {
			cpuShort = true
			continue
		}
		gpus := s.pick(sn, n.ci, count, frac)
		if gpus == nil && count > 0 {
			continue
		}
		s.take(sn, n, gpus, nil, frac)
		return ""
	}
	if cpuShort {
		return "no node has both the GPUs and the CPUs"
	}
	return ReasonNoFreeGPUs
}

// holds reports whether component ci holds any GPU of sn.
func (s *sticky) holds(sn *stickyNode, ci int) bool {
	for _, x := range sn.share[ci] {
		if x > eps {
			return true
		}
	}
	return false
}

// apart reports whether a component that may not share GPUs with ci holds
// any GPU of sn.
func (s *sticky) apart(sn *stickyNode, ci int) bool {
	for cj := range sn.share {
		if s.conflicts(ci, cj) && s.holds(sn, cj) {
			return true
		}
	}
	return false
}

// pick chooses count GPUs of sn for component ci, each taking frac:
// GPUs the component already shares first, so fractions pack; nil when
// sn has too few.
func (s *sticky) pick(sn *stickyNode, ci, count int, frac float64) []int {
	if count == 0 {
		return nil
	}
	var partial, free []int
	for g := range sn.healthy {
		if s.fits(sn, ci, g, frac) != "" {
			continue
		}
		if sn.share[ci][g] > eps {
			partial = append(partial, g)
		} else {
			free = append(free, g)
		}
	}
	cand := append(partial, free...)
	if len(cand) < count {
		return nil
	}
	out := append([]int(nil), cand[:count]...)
	sort.Ints(out)
	return out
}

// document lays the placed workers out as a plan: buffers on the train
// nodes, pools in the previous plan's node order, allocations exactly the
// GPUs the workers hold.
func (s *sticky) document(prev *Plan) *Plan {
	sp := s.spec.Placement
	doc := &Plan{
		Mode:                  sp.Mode,
		Strategy:              sp.Strategy,
		EnvStrategy:           sp.EnvStrategy,
		Notes:                 s.notes.list,
		StorageToTrainWorkers: map[string][]int{},
	}
	buffers := s.buffers(prev)
	sort.Slice(buffers, func(i, j int) bool { return buffers[i].Index < buffers[j].Index })
	all := make([]Worker, 0, len(s.placed)+len(buffers))
	all = append(append(all, s.placed...), buffers...)
	doc.Workers = all

	// Which nodes each pool holds, and which GPUs each component holds on
	// each node.
	type member struct {
		alloc [len(gpuComponents)][]bool
	}
	isMember := func(ms map[string]*member) map[string]bool {
		out := make(map[string]bool, len(ms))
		for id := range ms {
			out[id] = true
		}
		return out
	}
	members := map[string]map[string]*member{}
	for _, w := range all {
		if members[w.Pool] == nil {
			members[w.Pool] = map[string]*member{}
		}
		m := members[w.Pool][w.NodeID]
		if m == nil {
			m = &member{}
			members[w.Pool][w.NodeID] = m
		}
		ci := w.Component.Rank()
		if ci < 0 || ci >= len(gpuComponents) || len(w.GPUs) == 0 {
			continue
		}
		if m.alloc[ci] == nil {
			m.alloc[ci] = make([]bool, s.byID[w.NodeID].node.GPUs)
		}
		for _, g := range w.GPUs {
			m.alloc[ci][g] = true
		}
	}
	names := []string{TrainPool, RolloutPool}
	if sp.Strategy == StrategyColocate {
		names = []string{GlobalPool}
	}
	doc.Pools = []Pool{}
	for _, name := range names {
		ms := members[name]
		if len(ms) == 0 {
			continue
		}
		order := s.poolOrder(prev, name, isMember(ms))
		pool := Pool{Name: name, Nodes: make([]PoolNode, 0, len(order))}
		for _, id := range order {
			n := s.byID[id].node
			alloc := make(map[Component][]Range, 3)
			for ci, c := range gpuComponents {
				var gpus []int
				for g, held := range ms[id].alloc[ci] {
					if held {
						gpus = append(gpus, g)
					}
				}
				if len(gpus) > 0 {
					alloc[c] = rangesOf(gpus)
				}
			}
			pool.Nodes = append(pool.Nodes, PoolNode{NodeID: n.ID, IP: n.IP, TotalGPUs: n.GPUs, TotalCPUs: n.CPUs, Allocations: alloc})
		}
		doc.Pools = append(doc.Pools, pool)
	}
	doc.ResourcePool = exportPools(doc.Pools, s.all)
	bufOf := make(map[string]string, len(buffers))
	for _, b := range buffers {
		bufOf[b.NodeID] = strconv.Itoa(b.Index)
	}
	for _, w := range all {
		if k, ok := bufOf[w.NodeID]; ok && w.Component == Train {
			doc.StorageToTrainWorkers[k] = append(doc.StorageToTrainWorkers[k], w.Index)
		}
	}
	if bf := s.spec.Scheduling.Buffer; bf != nil && s.hasBuffer && !bf.Auto && bf.WorkerNum != len(buffers) {
		doc.Warnings = append(doc.Warnings, fmt.Sprintf(
			"scheduling.buffer.worker_num %d overridden: one buffer worker per node hosting train workers, %d in all",
			bf.WorkerNum, len(buffers)))
	}
	return doc
}

// poolOrder is the pool's nodes: those of prev's pool in prev's order,
// then the new members in the core's node order.
func (s *sticky) poolOrder(prev *Plan, name string, ms map[string]bool) []string {
	out := make([]string, 0, len(ms))
	seen := make(map[string]bool, len(ms))
	for _, p := range prev.Pools {
		if p.Name != name {
			continue
		}
		for _, n := range p.Nodes {
			if ms[n.NodeID] && !seen[n.NodeID] {
				seen[n.NodeID] = true
				out = append(out, n.NodeID)
			}
		}
	}
	for _, sn := range s.byRank {
		if id := sn.node.ID; ms[id] && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// buffers puts one buffer worker on every node that hosts train workers,
// as the core does. A buffer whose node still hosts train keeps its
// index when it can, so a launcher's buffer k stays where it was.
func (s *sticky) buffers(prev *Plan) []Worker {
	bf := s.spec.Scheduling.Buffer
	if !s.hasBuffer {
		return nil
	}
	var order []*stickyNode
	for _, sn := range s.nodes {
		if sn.hasTrain {
			order = append(order, sn)
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].firstTrain < order[j].firstTrain })
	n := len(order)
	index := make(map[string]int, n)
	used := make([]bool, n)
	for _, w := range prev.Workers {
		if w.Component != Buffer || w.Index >= n || used[w.Index] {
			continue
		}
		if sn := s.byID[w.NodeID]; sn != nil && sn.hasTrain {
			if _, ok := index[w.NodeID]; !ok {
				index[w.NodeID] = w.Index
				used[w.Index] = true
			}
		}
	}
	next := 0
	out := make([]Worker, 0, n)
	for _, sn := range order {
		k, ok := index[sn.node.ID]
		if !ok {
			for used[next] {
				next++
			}
			k = next
			used[k] = true
		}
		out = append(out, Worker{Component: Buffer, Index: k, Pool: s.poolOf(0), NodeID: sn.node.ID, IP: sn.node.IP, CPUs: bf.NumCPUs})
	}
	return out
}
