// Package plan is poolplanner's plan document, the JSON every planner
// publishes and any launcher reads: workers and their GPUs, pools, the
// rlightning resource_pool export, and why the plan is as it is; and the
// changes one revision makes to the next, from which any revision is
// rebuilt. It has no I/O: the planner makes documents, package client
// carries them over NATS.
package plan

// Component names a kind of RL worker. The four kinds and their spelling
// come from rlightning.
type Component string

// The worker kinds a spec schedules.
const (
	Train  Component = "train"
	Eval   Component = "eval"
	Env    Component = "env"
	Buffer Component = "buffer"
)

// Rank is the component's place in plan documents, which list workers
// train, eval, env, buffer, each by index; -1 for an unknown component.
// For train, eval and env it is also their index in GPUComponents.
func (c Component) Rank() int {
	switch c {
	case Train:
		return 0
	case Eval:
		return 1
	case Env:
		return 2
	case Buffer:
		return 3
	}
	return -1
}

// GPUComponents are the components that hold GPUs, in the order plans
// serve them (rlightning's order: train first, then eval, then env).
var GPUComponents = [...]Component{Train, Eval, Env}
