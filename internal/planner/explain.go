package planner

import (
	"fmt"
	"sort"
	"strings"
)

// Reasons a node was passed over, or stopped taking a component's workers.
// Tests assert on these; the text output and error messages print them.
const (
	ReasonNoFreeGPUs    = "no free GPUs"
	ReasonCPUsExhausted = "CPUs exhausted"
	ReasonTooSmall      = "too few GPUs for one worker"
	ReasonUnhealthyGPU  = "unhealthy GPU excluded"
	ReasonNoGPUs        = "no GPUs"
)

// Note records why a node did not take (more of) a component.
type Note struct {
	NodeID    string    `json:"node_id"`
	Component Component `json:"component,omitempty"`
	Reason    string    `json:"reason"`
}

// notes collects one note per node, component and reason.
type notes struct {
	list []Note
	seen map[Note]bool
}

func (n *notes) add(node string, c Component, reason string) {
	if n == nil {
		return
	}
	k := Note{node, c, reason}
	if n.seen == nil {
		n.seen = map[Note]bool{}
	}
	if n.seen[k] {
		return
	}
	n.seen[k] = true
	n.list = append(n.list, k)
}

// summary counts the notes for component c by reason: "2 nodes CPUs
// exhausted, 1 node too few GPUs for one worker".
func (n *notes) summary(c Component) string {
	if n == nil {
		return ""
	}
	count := map[string]int{}
	for _, x := range n.list {
		if x.Component == c || x.Component == "" {
			count[x.Reason]++
		}
	}
	if len(count) == 0 {
		return ""
	}
	reasons := make([]string, 0, len(count))
	for r := range count {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	parts := make([]string, 0, len(reasons))
	for _, r := range reasons {
		parts = append(parts, fmt.Sprintf("%d %s %s", count[r], plural(count[r], "node", "nodes"), r))
	}
	return strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
