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
	// state is nil for a plan read back from JSON.
	state *planState
}
