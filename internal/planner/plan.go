package planner

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Worker is one placed worker: where it runs and what it holds.
type Worker struct {
	Component Component `json:"component"`
	Index     int       `json:"index"`
	Pool      string    `json:"pool"`
	NodeID    string    `json:"node_id"`
	IP        string    `json:"ip"`
	// GPUs are node-local indices.
	GPUs     []int    `json:"gpus"`
	GPUUUIDs []string `json:"gpu_uuids"`
	// GPUShare is the fraction of each listed GPU the worker holds.
	GPUShare float64 `json:"gpu_share"`
	CPUs     float64 `json:"cpus"`
}

// PoolNode is one node of a pool and the GPUs each component holds there.
type PoolNode struct {
	NodeID      string                `json:"node_id"`
	IP          string                `json:"ip"`
	TotalGPUs   int                   `json:"total_gpus"`
	TotalCPUs   float64               `json:"total_cpus"`
	Allocations map[Component][]Range `json:"allocations"`
}

// Pool is a named resource pool with its nodes in pool order.
type Pool struct {
	Name  string     `json:"name"`
	Nodes []PoolNode `json:"nodes"`
}

// Plan is the plan document of the contract: the pools, every worker's
// place, and, when no valid plan exists, why.
type Plan struct {
	Name                  string           `json:"name"`
	Revision              int              `json:"revision"`
	CreatedAt             time.Time        `json:"created_at"`
	Reason                string           `json:"reason"`
	Mode                  string           `json:"mode"`
	Strategy              string           `json:"strategy"`
	EnvStrategy           string           `json:"env_strategy"`
	Valid                 bool             `json:"valid"`
	Error                 string           `json:"error"`
	ResourcePool          []PoolExport     `json:"resource_pool"`
	Pools                 []Pool           `json:"pools"`
	Workers               []Worker         `json:"workers"`
	StorageToTrainWorkers map[string][]int `json:"storage_to_train_workers"`
	// Moved counts workers whose place changed from the previous revision.
	Moved    int      `json:"moved"`
	Warnings []string `json:"warnings,omitempty"`
	// Notes say which nodes were passed over and why.
	Notes []Note `json:"notes,omitempty"`
}

// PlanError is a reason no valid plan exists.
type PlanError struct{ Msg string }

func (e *PlanError) Error() string { return e.Msg }

// Compute plans spec on nodes. It always returns a plan document; when no
// valid plan exists the document has Valid false and Error set, and the
// error is returned as well.
func Compute(spec *Spec, nodes []Node) (*Plan, error) {
	return ComputeWith(spec, nodes, Options{})
}

// Options tune a planning run.
type Options struct {
	// PoolsOnly plans as usual but leaves Workers and
	// StorageToTrainWorkers empty: enough for the rlightning export, and at
	// ten thousand nodes several times cheaper.
	PoolsOnly bool
}

// ComputeWith is Compute with options.
func ComputeWith(spec *Spec, nodes []Node, opt Options) (*Plan, error) {
	b := newBuild(spec, nodes, opt)
	err := b.run()
	doc := b.document()
	if err != nil {
		doc.Valid = false
		doc.Error = err.Error()
		return doc, err
	}
	doc.Valid = true
	return doc, nil
}

// Validate reports whether spec can be planned on nodes, and if not, why.
// It runs the planner itself, so validation and planning never disagree.
func Validate(spec *Spec, nodes []Node) error {
	_, err := Compute(spec, nodes)
	return err
}

// build is one planning run.
type build struct {
	spec    *Spec
	nodes   []Node
	states  []*nodeState
	byID    map[string]*nodeState
	pools   []*poolBuild
	pk      packer
	demands [len(gpuComponents)]*demand
	notes   notes
	// reserve is GPUs still to reserve at the end of the train range for a
	// buffer that uses CUDA, as rlightning does.
	reserve  int
	warnings []string
	buffers  []Worker
	s2t      map[string][]int
}

type poolBuild struct {
	name  string
	num   int // position among the run's pools
	nodes []*poolNodeBuild
	slab  []poolNodeBuild
}

type poolNodeBuild struct {
	ns    *nodeState
	alloc [len(gpuComponents)][]int
}

// has returns the node's entry in the pool, or nil.
func (p *poolBuild) has(ns *nodeState) *poolNodeBuild {
	if p.num < len(ns.pools) {
		return ns.pools[p.num]
	}
	return nil
}

func (p *poolBuild) node(ns *nodeState) *poolNodeBuild {
	if pn := p.has(ns); pn != nil {
		return pn
	}
	if len(p.slab) == cap(p.slab) {
		p.slab = make([]poolNodeBuild, 0, max(64, len(p.nodes)))
	}
	p.slab = append(p.slab, poolNodeBuild{ns: ns})
	pn := &p.slab[len(p.slab)-1]
	p.nodes = append(p.nodes, pn)
	for len(ns.pools) <= p.num {
		ns.pools = append(ns.pools, nil)
	}
	ns.pools[p.num] = pn
	return pn
}

func (b *build) pool(name string) *poolBuild {
	p := &poolBuild{name: name, num: len(b.pools)}
	b.pools = append(b.pools, p)
	return p
}

func newBuild(spec *Spec, nodes []Node, opt Options) *build {
	b := &build{spec: spec, nodes: nodes, byID: make(map[string]*nodeState, len(nodes))}
	b.pk.poolsOnly = opt.PoolsOnly
	b.states = newNodeStates(nodes)
	for i, ns := range b.states {
		b.byID[nodes[i].ID] = ns
		if len(ns.usable) < nodes[i].GPUs {
			b.notes.add(nodes[i].ID, "", ReasonUnhealthyGPU)
		}
	}
	b.pk.notes = &b.notes
	sc := spec.Scheduling
	b.demands[0] = newDemand(0, groupList(sc.Train))
	b.demands[1] = newDemand(1, groupList(sc.Eval))
	b.demands[2] = newDemand(2, sc.Env)
	if sc.Buffer != nil && b.demands[0].total > 0 {
		b.pk.hasBuffer = true
		b.pk.bufferCPUs = sc.Buffer.NumCPUs
		b.reserve = b.bufferReserve()
	}
	return b
}

func groupList(g *WorkerGroup) []WorkerGroup {
	if g == nil {
		return nil
	}
	return []WorkerGroup{*g}
}

// bufferReserve is the GPUs rlightning adds to the train range for the
// configured buffer workers (worker_num x num_gpus); "auto" counts as one.
func (b *build) bufferReserve() int {
	bf := b.spec.Scheduling.Buffer
	n := bf.WorkerNum
	if bf.Auto {
		n = 1
	}
	return int(math.Ceil(float64(n)*bf.NumGPUs - eps))
}

func (b *build) run() error {
	// The arithmetic goes first: it needs only totals, while recording
	// workers needs memory for every one a spec asks for.
	if err := b.checkCPUs(); err != nil {
		return err
	}
	auto := b.spec.Placement.Mode != ModeManual
	if auto {
		if err := b.checkGPUs(); err != nil {
			return err
		}
		if err := b.checkWorkerSize(); err != nil {
			return err
		}
	}
	b.pk.reserve(b.demands, min(len(b.nodes), b.demands[0].total))
	var err error
	if !auto {
		err = b.manual()
	} else {
		sortNodes(b.states)
		if b.spec.Placement.Strategy == StrategyColocate {
			b.colocate()
		} else {
			b.disaggregate()
		}
	}
	if err != nil {
		return err
	}
	for _, d := range b.demands {
		if !d.done() {
			return b.shortfall(d)
		}
	}
	b.placeBuffers()
	return nil
}

// required is rlightning's GPU arithmetic, with each component counted as
// the packing needs it.
func (b *build) required() float64 {
	sc := b.spec.Scheduling
	train := 0
	if b.demands[0].total > 0 {
		train = gpusNeeded(b.demands[0].groups) + b.reserve
	}
	eval := gpusNeeded(b.demands[1].groups)
	env := gpusNeeded(sc.Env)
	rollout := eval + env
	if b.spec.Placement.EnvStrategy == EnvStrategyDeviceColocate {
		rollout = max(eval, env)
	}
	if b.spec.Placement.Strategy == StrategyColocate {
		return float64(max(train, rollout))
	}
	return float64(train + rollout)
}

func (b *build) checkGPUs() error {
	avail := 0
	for _, ns := range b.states {
		avail += len(ns.usable)
	}
	if req := b.required(); req > float64(avail) {
		return &PlanError{fmt.Sprintf("Insufficient GPUs: required %s, available %d", pyFloat(req), avail)}
	}
	return nil
}

func (b *build) checkCPUs() error {
	sc := b.spec.Scheduling
	req := 0.0
	for _, d := range b.demands {
		for _, g := range d.groups {
			req += float64(g.WorkerNum) * g.NumCPUs
		}
	}
	if sc.Buffer != nil && b.demands[0].total > 0 {
		n := sc.Buffer.WorkerNum
		if sc.Buffer.Auto {
			n = 1
		}
		req += float64(n) * sc.Buffer.NumCPUs
	}
	avail := 0.0
	for _, ns := range b.states {
		avail += ns.node.CPUs
	}
	if req > avail+eps {
		return &PlanError{fmt.Sprintf("Insufficient CPUs: required %s, available %s", pyFloat(req), pyFloat(avail))}
	}
	return nil
}

// checkWorkerSize refuses a multi-GPU worker no node can hold, since a
// worker never spans nodes.
func (b *build) checkWorkerSize() error {
	largest, largestID := 0, ""
	for _, ns := range b.states {
		if len(ns.usable) > largest {
			largest, largestID = len(ns.usable), ns.node.ID
		}
	}
	for _, d := range b.demands {
		for _, g := range d.groups {
			if k := int(math.Round(g.NumGPUs)); g.NumGPUs > 1 && k > largest {
				where := "no node has usable GPUs"
				if largestID != "" {
					where = fmt.Sprintf("the largest node, %s, has %d usable", largestID, largest)
				}
				return &PlanError{fmt.Sprintf("Cannot place %s: each worker needs %d GPUs of one node, and %s", d.comp, k, where)}
			}
		}
	}
	return nil
}

func (b *build) shortfall(d *demand) error {
	g := d.groups[min(d.gi, len(d.groups)-1)]
	msg := fmt.Sprintf("Cannot place %s: %d of %d workers placed; the next needs %s GPU and %s CPU",
		d.comp, d.index, d.total, pyNum(g.NumGPUs), pyNum(g.NumCPUs))
	if s := b.notes.summary(d.comp); s != "" {
		msg += "; " + s
	}
	return &PlanError{msg}
}

// placeBuffers puts one buffer worker on every node that hosts train
// workers, in train order, and maps it to those train workers.
func (b *build) placeBuffers() {
	bf := b.spec.Scheduling.Buffer
	b.s2t = map[string][]int{}
	if bf == nil || b.demands[0].total == 0 || b.pk.poolsOnly {
		return
	}
	train := b.pk.workers[b.pk.base[0] : b.pk.base[0]+b.demands[0].total]
	var held map[string]map[int]bool
	if bf.NumGPUs > 0 {
		held = map[string]map[int]bool{}
		for _, w := range train {
			if held[w.NodeID] == nil {
				held[w.NodeID] = map[int]bool{}
			}
			for _, g := range w.GPUs {
				held[w.NodeID][g] = true
			}
		}
	}
	bufOf := make(map[string]int, len(b.states))
	for _, w := range train {
		k, ok := bufOf[w.NodeID]
		if !ok {
			k = len(b.buffers)
			bufOf[w.NodeID] = k
			ns := b.byID[w.NodeID]
			bw := Worker{Component: Buffer, Index: k, Pool: w.Pool, NodeID: w.NodeID, IP: ns.node.IP, CPUs: bf.NumCPUs}
			if bf.NumGPUs > 0 {
				b.bufferGPUs(&bw, ns, held[w.NodeID])
			}
			b.buffers = append(b.buffers, bw)
		}
		key := strconv.Itoa(k)
		b.s2t[key] = append(b.s2t[key], w.Index)
	}
	if !bf.Auto && bf.WorkerNum != len(b.buffers) {
		b.warnings = append(b.warnings, fmt.Sprintf(
			"scheduling.buffer.worker_num %d overridden: one buffer worker per node hosting train workers, %d in all",
			bf.WorkerNum, len(b.buffers)))
	}
}

// bufferGPUs gives a buffer that uses CUDA the GPUs reserved for it in its
// node's train range: those no train worker holds.
func (b *build) bufferGPUs(bw *Worker, ns *nodeState, held map[int]bool) {
	bf := b.spec.Scheduling.Buffer
	var alloc []int
	for _, p := range b.pools {
		if p.name == bw.Pool {
			if pn := p.has(ns); pn != nil {
				alloc = pn.alloc[0]
			}
		}
	}
	want := max(1, int(math.Ceil(bf.NumGPUs-eps)))
	for _, g := range alloc {
		if len(bw.GPUs) < want && !held[g] {
			bw.GPUs = append(bw.GPUs, g)
			if len(ns.node.GPUUUIDs) == ns.node.GPUs {
				bw.GPUUUIDs = append(bw.GPUUUIDs, ns.node.GPUUUIDs[g])
			}
		}
	}
	if len(bw.GPUs) > 0 {
		bw.GPUShare = min(bf.NumGPUs, 1)
	}
}

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
