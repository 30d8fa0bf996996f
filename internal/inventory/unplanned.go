package inventory

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

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

// UnplannedIn is UnplannedUse of nodes with the UUIDs the workers of
// docs are placed on, without the set of every placed UUID: only the
// GPUs that run processes (few, mostly none) are looked up, so that a
// metrics scrape at 20,000 nodes does not build a map of 160,000 UUIDs.
func UnplannedIn(nodes []NodeInventory, docs ...*plan.Document) []UnplannedGPU {
	// Each busy GPU's UUID, true once a worker is found placed on it.
	busy := map[string]bool{}
	for _, n := range nodes {
		for _, g := range n.GPUs {
			if len(g.Processes) > 0 {
				busy[g.UUID] = false
			}
		}
	}
	if len(busy) == 0 {
		return nil
	}
	for _, d := range docs {
		for _, w := range d.Workers.All() {
			for _, u := range w.GPUUUIDs {
				if _, ok := busy[u]; ok {
					busy[u] = true
				}
			}
		}
	}
	return UnplannedUse(nodes, busy)
}

// String is the process as people read it: "pid 48211 (python)".
func (p Process) String() string {
	s := "pid " + strconv.FormatUint(uint64(p.PID), 10)
	if p.Name != "" {
		s += " (" + clip(p.Name, listedName) + ")"
	}
	return s
}

// How much of a GPU's processes people are shown: a document may list
// MaxProcesses of MaxString-byte names on each of MaxGPUs GPUs, and a
// hostile one does.
const (
	listedProcesses = 8
	listedName      = 64
)

// ProcessList is processes as people read them, comma-separated: the
// first few, each name clipped, and how many more.
func ProcessList(ps []Process) string {
	out := make([]string, 0, min(len(ps), listedProcesses+1))
	for _, p := range ps[:min(len(ps), listedProcesses)] {
		out = append(out, p.String())
	}
	if more := len(ps) - listedProcesses; more > 0 {
		out = append(out, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(out, ", ")
}

// clip shortens s to at most most bytes (at a rune's start), marked
// with an ellipsis and its length when cut.
func clip(s string, most int) string {
	if len(s) <= most {
		return s
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}
