package planner

import "github.com/poolplanner/poolplanner/plan"

// The plan document and its parts are package plan's, public, so that
// launchers can read them; the planner makes them.
type (
	Component       = plan.Component
	Worker          = plan.Worker
	Workers         = plan.Workers
	PoolNode        = plan.PoolNode
	GroupCounts     = plan.GroupCounts
	Pool            = plan.Pool
	PoolExport      = plan.PoolExport
	ComponentIndex  = plan.ComponentIndex
	ComponentCounts = plan.ComponentCounts
	Range           = plan.Range
	Demand          = plan.Demand
	Capacity        = plan.Capacity
	Explanation     = plan.Explanation
	ReasonCount     = plan.ReasonCount
	Note            = plan.Note
	Unplaced        = plan.Unplaced
	PendingSpec     = plan.PendingSpec
)

// The states of a plan (plan.Header.State).
const (
	StateValid    = plan.StateValid
	StateDegraded = plan.StateDegraded
	StateInvalid  = plan.StateInvalid
)

// The worker kinds a spec schedules.
const (
	Train  = plan.Train
	Eval   = plan.Eval
	Env    = plan.Env
	Buffer = plan.Buffer
)

// gpuComponents are the components that hold GPU ranges, in the order the
// planner serves them.
var gpuComponents = plan.GPUComponents

// Plan is a plan document and what the run that made it keeps for the
// next incremental run.
type Plan struct {
	plan.Document
	// state is nil for a plan read back from JSON, and for a degraded
	// plan (its workers are not its run's slots).
	state *planState
	// spec is the spec the run that made the plan placed (nil: read back
	// from JSON): a degraded plan's, or a kept placement's whose new spec
	// is pending, is what the next run re-checks it against.
	spec *Spec
	// A degraded plan's cause is why its spec cannot be placed whole,
	// before Error words it as degraded; afresh is the plan made afresh
	// on the same room, which failed: what it is released as when a plan
	// of higher priority takes its GPUs; takenBy names the plans holding
	// GPUs of the workers its run could not keep (WhyPreempted).
	cause   string
	afresh  *Outcome
	takenBy []string
}
