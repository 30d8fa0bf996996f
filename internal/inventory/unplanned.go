package inventory

import (
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// UnplannedGPU is a GPU that runs processes though no worker is placed
// on it: a worker a plan moved away that has not stopped, or work
// started outside poolplanner.
type UnplannedGPU struct {
	NodeID    string    `json:"node_id"`
	Index     int       `json:"index"`
	UUID      string    `json:"uuid"`
	Processes []Process `json:"processes"`
}

// UnplannedUse lists, node by node in the order given, the GPUs that run
// processes while placed (the UUIDs workers are placed on) has none of
// them.
func UnplannedUse(nodes []NodeInventory, placed map[string]bool) []UnplannedGPU {
	var out []UnplannedGPU
	for _, n := range nodes {
		for _, g := range n.GPUs {
			if len(g.Processes) > 0 && !placed[g.UUID] {
				out = append(out, UnplannedGPU{NodeID: n.NodeID, Index: g.Index, UUID: g.UUID, Processes: g.Processes})
			}
		}
	}
	return out
}

// PlacedUUIDs is the GPU UUIDs the workers of docs are placed on.
func PlacedUUIDs(docs ...*plan.Document) map[string]bool {
	out := map[string]bool{}
	for _, d := range docs {
		for _, w := range d.Workers.All() {
			for _, u := range w.GPUUUIDs {
				out[u] = true
			}
		}
	}
	return out
}

// String is the process as people read it: "pid 48211 (python)".
func (p Process) String() string {
	s := "pid " + strconv.FormatUint(uint64(p.PID), 10)
	if p.Name != "" {
		s += " (" + p.Name + ")"
	}
	return s
}

// ProcessList is processes as people read them, comma-separated.
func ProcessList(ps []Process) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}
