package planner

import (
	"errors"
	"math"
	"reflect"
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
	// UnhealthyGPUs are the node's GPUs that get no work.
	UnhealthyGPUs []int `json:"unhealthy_gpus,omitempty"`
	// WorkerCounts counts the workers of each component here, per
	// scheduling group.
	WorkerCounts GroupCounts `json:"worker_counts"`
}

// GroupCounts holds a count per scheduling group of each component: one
// for train and eval, one per entry of scheduling.env.
type GroupCounts struct {
	Train []int `json:"train,omitempty"`
	Eval  []int `json:"eval,omitempty"`
	Env   []int `json:"env,omitempty"`
}

// Of is component c's counts.
func (g *GroupCounts) Of(c Component) *[]int {
	switch c {
	case Train:
		return &g.Train
	case Eval:
		return &g.Eval
	}
	return &g.Env
}

// Pool is a named resource pool with its nodes in pool order.
type Pool struct {
	Name  string     `json:"name"`
	Nodes []PoolNode `json:"nodes"`
}

// Plan is the plan document of the contract: the pools, every worker's
// place, and why: a valid plan explains the constraints that shaped it, an
// invalid one carries its error, the reasons and the spec's demands, and
// no placement.
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
	Workers               Workers          `json:"workers"`
	StorageToTrainWorkers map[string][]int `json:"storage_to_train_workers"`
	// Moved counts workers whose place changed from the previous revision.
	Moved    int      `json:"moved"`
	Warnings []string `json:"warnings,omitempty"`
	// Demands are the spec's scheduling entries; Capacity its arithmetic.
	Demands  []Demand `json:"demands"`
	Capacity Capacity `json:"capacity"`
	// Explanations say, per component, why it is placed as it is.
	Explanations []Explanation `json:"explanations,omitempty"`
	// Notes are the reasons recorded against each node.
	Notes []Note `json:"notes,omitempty"`

	// state is the run's state, for the next incremental plan; nil for a
	// plan read back from JSON.
	state *planState
}

// PlanError is a reason no valid plan exists.
type PlanError struct{ Msg string }

func (e *PlanError) Error() string { return e.Msg }

// Compute plans spec on nodes afresh. It always returns a plan document;
// when no valid plan exists the document has Valid false and Error set,
// and the error is returned as well.
func Compute(spec *Spec, nodes []Node) (*Plan, error) {
	return ComputeWith(spec, nodes, Options{})
}

// ComputeWith is Compute with options.
func ComputeWith(spec *Spec, nodes []Node, opt Options) (*Plan, error) {
	e := newEngine(spec, opt)
	return e.finish(e.run(nodes))
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
func Replan(prev *Plan, spec *Spec, nodes []Node) (*Plan, *Change, error) {
	if why := freshWhy(prev, spec); why != "" {
		return fresh(prev, spec, nodes, why)
	}
	e := newEngine(spec, Options{})
	e.prev, e.prevState = prev, prev.state
	err := e.run(nodes)
	var short *shortfallError
	if errors.As(err, &short) {
		return fresh(prev, spec, nodes, "the incremental plan could not place every worker: "+err.Error())
	}
	doc, err := e.finish(err)
	ch := &Change{Displaced: e.displaced}
	if err != nil {
		return doc, ch, err
	}
	if e.fast {
		doc.Moved = e.moved() + e.bufferMoves
	} else {
		doc.Moved = CountMoved(prev, doc)
	}
	return doc, ch, nil
}

func fresh(prev *Plan, spec *Spec, nodes []Node, why string) (*Plan, *Change, error) {
	doc, err := Compute(spec, nodes)
	if err == nil {
		doc.Moved = CountMoved(prev, doc)
	}
	return doc, &Change{Fresh: true, FreshWhy: why}, err
}

// freshWhy says why prev cannot be the base of an incremental plan for
// spec, or "" when it can.
func freshWhy(prev *Plan, spec *Spec) string {
	sp := spec.Placement
	switch {
	case prev == nil:
		return "first plan"
	case !prev.Valid:
		return "the previous plan was not valid"
	case prev.Mode != sp.Mode:
		return "placement changed"
	case sp.Mode != ModeManual && (prev.Strategy != sp.Strategy || prev.EnvStrategy != sp.EnvStrategy):
		return "placement changed"
	}
	return ""
}

// run places the spec: the arithmetic first, then (incremental) the
// previous plan's workers where they still fit, then the passes.
func (e *engine) run(nodes []Node) error {
	order, err := sortedNodes(nodes)
	if err != nil {
		return err
	}
	e.fast = e.prev != nil && e.prevState.reusable(e.spec)
	if e.fast {
		e.adoptFast(nodes, order)
	} else {
		e.loadAll(nodes, order)
		if !e.opt.PoolsOnly {
			e.store = newStore(e.slots)
		}
	}
	if err := e.checkCapacity(); err != nil {
		return err
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
		e.adoptSlow()
		src = e.room
	default:
		src = make([]int32, len(e.table))
		for i := range src {
			src[i] = int32(i)
		}
	}
	e.attempted = true
	e.place(rankOrder(e.table, src))
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
