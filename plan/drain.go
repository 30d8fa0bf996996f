package plan

import (
	"fmt"
	"time"
)

// Drain is a node or GPU taken out of placement, as a plan's status
// names it: by an operator (planner drain), or by the planner itself (a
// GPU that keeps turning unhealthy). Text renders it for people.
type Drain struct {
	NodeID string `json:"node_id"`
	// GPU is the node-local index drained; nil: the whole node.
	GPU *int `json:"gpu,omitempty"`
	// Cause is who took it out and why, one of the Drain kinds.
	Cause string `json:"cause"`
	// Reason is the operator's --reason (or the planner's words).
	Reason string `json:"reason,omitempty"`
	// Deadline, while it has not passed, is when the workers there
	// leave (planner drain --deadline); nil or passed: they left.
	Deadline *time.Time `json:"deadline,omitempty"`
}

// Why a node or GPU is drained (Drain.Cause).
const (
	// DrainOperator: planner drain.
	DrainOperator = "operator"
	// DrainFlapping: the GPU (or node) turned unhealthy too often; held
	// out until an operator undrains it.
	DrainFlapping = "flapping"
	// DrainProbation: the GPU recovered a moment ago; out until its
	// probation ends.
	DrainProbation = "probation"
)

// Target is the drained node ("n2") or GPU ("n2:3").
func (d Drain) Target() string {
	if d.GPU == nil {
		return d.NodeID
	}
	return fmt.Sprintf("%s:%d", d.NodeID, *d.GPU)
}

// Text is the drain as a revision's reason says it: "drained n2
// (driver upgrade)", "n2 draining: its workers leave at 2026-01-02T03:04:05Z
// (driver upgrade)", "held out n1:3 (unhealthy 3 times within 1h0m0s)".
func (d Drain) Text(leaving bool) string {
	why := ""
	if d.Reason != "" {
		why = " (" + d.Reason + ")"
	}
	switch {
	case leaving && d.Deadline != nil:
		return fmt.Sprintf("%s draining: its workers leave at %s%s", d.Target(), d.Deadline.UTC().Format(time.RFC3339), why)
	case d.Cause == DrainFlapping:
		return "held out " + d.Target() + why
	case d.Cause == DrainProbation:
		return "on probation " + d.Target() + why
	}
	return "drained " + d.Target() + why
}

// SameDrains compares two lists of drains as a status carries them.
func SameDrains(a, b []Drain) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.NodeID != y.NodeID || x.Cause != y.Cause || x.Reason != y.Reason || (x.GPU == nil) != (y.GPU == nil) ||
			x.GPU != nil && *x.GPU != *y.GPU || (x.Deadline == nil) != (y.Deadline == nil) ||
			x.Deadline != nil && !x.Deadline.Equal(*y.Deadline) {
			return false
		}
	}
	return true
}
