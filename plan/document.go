package plan

import (
	"fmt"
	"strings"
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
	// GPUModel is the node's GPU model as NVML names it (models joined
	// by "+" in GPU order on a mixed node); NVLinkDomain its NVLink
	// domain. Empty where the inventory does not say.
	GPUModel     string `json:"gpu_model,omitempty"`
	NVLinkDomain string `json:"nvlink_domain,omitempty"`
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
	Name  string    `json:"name"`
	Nodes PoolNodes `json:"nodes"`
}

// Document is the plan document of the contract: the pools, every
// worker's place, and why: a valid plan explains the constraints that
// shaped it, an invalid one carries its error, the reasons and the spec's
// demands, and no placement. It is its Header and its Placement.
type Document struct {
	Header
	Placement
}

// Header is what a plan document says besides its placement: which
// revision, why it exists, what state it is in, and why the placement is
// as it is.
//
// Status is the one source of the plan's state: valid, state and removed,
// which older readers rely on, are derived from it when the header is
// written (MarshalJSON) and read into it from a document written before
// it (UnmarshalJSON). Code asks Status, or Valid, Removed and PlanState,
// which read it.
type Header struct {
	Name        string    `json:"name"`
	Revision    int       `json:"revision"`
	CreatedAt   time.Time `json:"created_at"`
	Reason      string    `json:"reason"`
	Mode        string    `json:"mode"`
	Strategy    string    `json:"strategy"`
	EnvStrategy string    `json:"env_strategy"`
	// Error says in words, for people, why the plan is not valid (Status
	// says it as a value); empty for a valid plan.
	Error string `json:"error"`
	// Unplaced are a degraded plan's workers that have no place now, each
	// with why and where it ran last (empty for one never placed). Its
	// GPUs there stay the plan's: when they come back the worker returns
	// to them.
	Unplaced []Unplaced `json:"unplaced,omitempty"`
	// PendingSpec is set while the plan's stored spec cannot be placed:
	// the placement (and Demands) are the last spec's, kept in force, and
	// the reason says why the new spec waits. The plan moves to the new
	// spec as soon as it fits.
	PendingSpec *PendingSpec `json:"pending_spec,omitempty"`
	// Moved counts workers whose place changed from the previous revision.
	Moved    int      `json:"moved"`
	Warnings []string `json:"warnings,omitempty"`
	// Demands are the spec's scheduling entries; Capacity its arithmetic.
	Demands  []Demand `json:"demands"`
	Capacity Capacity `json:"capacity"`
	// Explanations say, per component, why it is placed as it is.
	Explanations []Explanation `json:"explanations,omitempty"`
	// Priority is the spec's, among plans sharing the cluster; GPUsHeld,
	// the GPUs the plan's workers use (wholly or in part, each once).
	Priority int `json:"priority"`
	GPUsHeld int `json:"gpus_held"`
	// PreemptedBy names the plans placed first (higher priority) that
	// took GPUs this plan held, when it gave way to them. It is a fact of
	// the revision, not its state: a plan moved off GPUs it held may be
	// valid elsewhere. Status.Reason ReasonPreempted is the state.
	PreemptedBy []string `json:"preempted_by,omitempty"`
	// Status is the plan's state and why, as a value; its zero State
	// (or one not known) reads as StateInvalid: see PlanState.
	Status Status `json:"status"`
}

// Valid reports whether every worker the spec asks for is placed.
func (h *Header) Valid() bool { return h.Status.State == StateValid }

// Removed reports whether the plan's spec was removed and its workers
// released: the plan's last revision.
func (h *Header) Removed() bool { return h.Status.Reason == ReasonRemoved }

// Status is a plan's state and why, as a value. Error says the same in
// words; a reader that acts on why (a dashboard, the planner itself
// comparing revisions) reads this instead of parsing the words.
type Status struct {
	// State is StateValid, StateDegraded or StateInvalid.
	State State `json:"state"`
	// Reason is why a plan is not valid (one of the Reason kinds);
	// for a valid plan empty, or ReasonShrunk / ReasonGrew when its
	// elastic groups were resized (Resized); empty too for an older
	// document whose reason is not known.
	Reason Reason `json:"reason,omitempty"`
	// By names the plans the reason is about: those that preempted it,
	// or hold the room it waits for.
	By []string `json:"by,omitempty"`
	// Cause is the spec's own reason, in words, that a preemption, a
	// wait or a degradation comes down to (Error without what it says
	// of other plans and unplaced workers).
	Cause string `json:"cause,omitempty"`
	// Fresh, when the placement was made afresh rather than from the
	// previous revision's, says why (one of the Fresh kinds; Reason
	// words it).
	Fresh string `json:"fresh,omitempty"`
	// Resized lists the elastic groups whose worker count this revision
	// changed (Reason ReasonShrunk or ReasonGrew on a valid plan).
	Resized []Resize `json:"resized,omitempty"`
	// Drained are the drains that moved this revision's workers off
	// their node or GPU, or keep a degraded plan's workers unplaced.
	// Leaving are the drains whose deadline has not passed yet on nodes
	// or GPUs this plan's workers use: those workers leave then.
	Drained []Drain `json:"drained,omitempty"`
	Leaving []Drain `json:"leaving,omitempty"`
}

// Why a placement was made afresh (Status.Fresh).
const (
	// FreshFirst: the plan's first placement.
	FreshFirst = "first"
	// FreshAfterInvalid: the previous revision placed nothing.
	FreshAfterInvalid = "after_invalid"
	// FreshPlacementChanged: the spec's placement mode or strategies
	// changed.
	FreshPlacementChanged = "placement_changed"
	// FreshShortfall: keeping the previous workers left too little room
	// for the others.
	FreshShortfall = "shortfall"
	// FreshDomains: kept workers of an nvlink_domain strict group span
	// several NVLink domains.
	FreshDomains = "nvlink_domains"
	// FreshQuota: keeping the previous workers needs more GPUs than
	// max_gpus.
	FreshQuota = "quota"
)

// Reason is why a plan is in its state (Status.Reason): why it is not
// valid, or how a valid one's elastic groups changed.
type Reason string

// Why a plan is not valid (Status.Reason).
const (
	// ReasonSpec: the spec cannot be placed on the cluster, or has an
	// error of its own; Cause says which.
	ReasonSpec Reason = "spec"
	// ReasonQuota: the plan needs more GPUs than its max_gpus.
	ReasonQuota Reason = "quota"
	// ReasonPreempted: plans of higher priority (By) took GPUs it held,
	// and it would fit with them back.
	ReasonPreempted Reason = "preempted"
	// ReasonWaiting: it would fit if the plans By (of its priority or
	// higher) gave room back.
	ReasonWaiting Reason = "waiting"
	// ReasonRemoved: the plan's spec was removed.
	ReasonRemoved Reason = "removed"
	// ReasonDrained: a degraded plan whose unplaced workers all left
	// drained nodes or GPUs (Status.Drained): there is no room elsewhere.
	ReasonDrained Reason = "drained"
)

// State is a plan's state (Status.State).
type State string

// The states of a plan document.
const (
	// StateValid: every worker the spec asks for is placed.
	StateValid State = "valid"
	// StateDegraded: the plan keeps every worker whose place still holds
	// and lists the others in Unplaced: a fault, not a release.
	StateDegraded State = "degraded"
	// StateInvalid: no placement.
	StateInvalid State = "invalid"
)

// Unplaced is a worker of a degraded plan that has no place now.
type Unplaced struct {
	Component Component `json:"component"`
	Index     int       `json:"index"`
	// Reason says why it left its place and found no other, as a
	// revision's reason says it ("node left n3", "GPU unhealthy n1:3").
	Reason string `json:"reason"`
	// Pool, NodeID, GPUs and GPUUUIDs are where it ran last (empty: it
	// never ran): the place it returns to when that place holds again.
	Pool     string   `json:"pool,omitempty"`
	NodeID   string   `json:"node_id,omitempty"`
	GPUs     []int    `json:"gpus,omitempty"`
	GPUUUIDs []string `json:"gpu_uuids,omitempty"`
}

// PendingSpec says that the plan's stored spec is not yet in force, and
// why.
type PendingSpec struct {
	Reason string `json:"reason"`
}

// PlanState is the document's state: Status.State, StateInvalid when
// it says none or one this package does not know (a header that does
// not say it places workers places none).
func (h *Header) PlanState() State {
	switch h.Status.State {
	case StateValid, StateDegraded:
		return h.Status.State
	}
	return StateInvalid
}

// Placed reports whether the document places workers that hold their
// GPUs: a valid plan, or a degraded one (some of its workers unplaced).
// Launchers run the workers of either; only an invalid plan has none.
func (h *Header) Placed() bool { return h.PlanState() != StateInvalid }

// Placement is where a plan puts everything: the rlightning export, the
// pools, the workers, the buffers' train workers, and the reasons
// recorded against each node.
type Placement struct {
	ResourcePool          []PoolExport     `json:"resource_pool"`
	Pools                 []Pool           `json:"pools"`
	Workers               Workers          `json:"workers"`
	StorageToTrainWorkers map[string][]int `json:"storage_to_train_workers"`
	// Notes are the reasons recorded against each node.
	Notes []Note `json:"notes,omitempty"`
}

// Capacity is the spec's arithmetic against the inventory, the first
// check a plan meets: it needs only totals, while placing workers needs
// memory for every one a spec asks for.
type Capacity struct {
	// GPUsRequired is rlightning's GPU arithmetic, each component counted
	// as the packing needs it; checked in auto mode only (manual pools say
	// which GPUs themselves).
	GPUsRequired  float64 `json:"gpus_required"`
	GPUsAvailable int     `json:"gpus_available"`
	CPUsRequired  float64 `json:"cpus_required"`
	CPUsAvailable float64 `json:"cpus_available"`
}

// Demand is one scheduling entry of the spec: how many workers and what
// each asks for.
type Demand struct {
	Component Component `json:"component"`
	Workers   int       `json:"workers"`
	// Auto is set for a buffer with worker_num "auto".
	Auto bool `json:"auto,omitempty"`
	// Min and Max are an elastic group's range (worker_num {min, max});
	// Workers is then how many it holds now. Both 0 for a fixed count.
	Min     int     `json:"min,omitempty"`
	Max     int     `json:"max,omitempty"`
	NumGPUs float64 `json:"num_gpus"`
	NumCPUs float64 `json:"num_cpus"`
}

// Note records a reason against one node: a component it was excluded
// for or took only in part, or (no component) the node as a whole.
type Note struct {
	NodeID    string    `json:"node_id"`
	Component Component `json:"component,omitempty"`
	Reason    string    `json:"reason"`
}

// Explanation says why one component was not placed in full, or not
// where it would go first, grouped as Nomad's AllocMetric groups it:
// which reason excluded how many nodes, which compromises were made, and
// (incremental plans) which workers of the previous plan had to move.
type Explanation struct {
	Component Component `json:"component"`
	Asked     int       `json:"asked"`
	Placed    int       `json:"placed"`
	// Excluded counts the nodes each reason excluded.
	Excluded []ReasonCount `json:"excluded,omitempty"`
	// Compromises counts the nodes the component took against its first
	// preference (ReasonPoolShared).
	Compromises []ReasonCount `json:"compromises,omitempty"`
	// Displaced counts the workers of the previous plan that could not
	// stay, by why (the Why constants) and the nodes they were on.
	Displaced []ReasonCount `json:"displaced,omitempty"`
}

// ReasonCount is one reason and how many nodes (and, for displaced
// workers, workers) it concerns, with the first few node ids.
type ReasonCount struct {
	Reason  string   `json:"reason"`
	Nodes   int      `json:"nodes"`
	Workers int      `json:"workers,omitempty"`
	NodeIDs []string `json:"node_ids,omitempty"`
}

// String reads as a person would say it: "CPUs exhausted on 12 nodes
// (n1, n2, ...)", "unhealthy GPU excluded on node-07".
func (r ReasonCount) String() string {
	s := r.Reason
	if r.Workers > 0 {
		s = fmt.Sprintf("%d %s: %s", r.Workers, plural(r.Workers, "worker", "workers"), s)
	}
	if r.Nodes == 0 {
		return s
	}
	if r.Nodes == 1 && len(r.NodeIDs) == 1 {
		return s + " on " + r.NodeIDs[0]
	}
	s += fmt.Sprintf(" on %d %s", r.Nodes, plural(r.Nodes, "node", "nodes"))
	if len(r.NodeIDs) > 0 {
		s += " (" + strings.Join(r.NodeIDs, ", ")
		if r.Nodes > len(r.NodeIDs) {
			s += fmt.Sprintf(" and %d more", r.Nodes-len(r.NodeIDs))
		}
		s += ")"
	}
	return s
}

// ExcludedText is the exclusions in one line: "fewer than 4 healthy GPUs
// on 30 nodes (...), CPUs exhausted on 12 nodes (...)".
func (x Explanation) ExcludedText() string {
	parts := make([]string, len(x.Excluded))
	for i, r := range x.Excluded {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// Text is the explanation as a person reads it, one line per reason.
func (x Explanation) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d placed\n", x.Component, x.Placed, x.Asked)
	for _, r := range x.Excluded {
		fmt.Fprintf(&b, "  excluded: %s\n", r)
	}
	for _, r := range x.Compromises {
		fmt.Fprintf(&b, "  compromise: %s\n", r)
	}
	for _, r := range x.Displaced {
		fmt.Fprintf(&b, "  placed again: %s\n", r)
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
