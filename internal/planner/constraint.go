package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Constraints say where a worker group may run: on nodes whose labels
// match NodeSelector, on GPUs whose model matches one of GPUModels
// (a case-insensitive substring of NVML's name, "H100" for "NVIDIA
// H100 80GB HBM3") and that have at least MinGPUMemoryGB. A node
// qualifies with only its matching healthy GPUs. The zero value allows
// anything.
//
// GPULink says how the GPUs of one multi-GPU worker must be linked:
// LinkAny (""), LinkNVLink (pairwise NVLink peers), LinkNUMA (one NUMA
// node), LinkPreferNVLink (NVLink where the node can, else one NUMA node,
// else any, noted as a compromise).
type Constraints struct {
	NodeSelector   map[string]string `json:"node_selector,omitempty"`
	GPUModels      []string          `json:"gpu_model,omitempty"`
	MinGPUMemoryGB float64           `json:"min_gpu_memory_gb,omitempty"`
	GPULink        string            `json:"gpu_link,omitempty"`
	// NVLinkDomain is where the group's workers go among NVLink domains:
	// DomainAny (""), DomainPack, DomainStrict.
	NVLinkDomain string `json:"nvlink_domain,omitempty"`
}

// gpu_link values.
const (
	LinkAny          = "any"
	LinkNVLink       = "nvlink"
	LinkNUMA         = "numa"
	LinkPreferNVLink = "prefer-nvlink"
)

// ReasonPreferNVLink is a compromise: a prefer-nvlink worker placed on
// GPUs without NVLink between them.
const ReasonPreferNVLink = "gpu_link prefer-nvlink: placed without NVLink (no NVLink-peer GPUs free)"

// linkReason is why a node took no worker of a group whose GPUs must be
// linked: count GPUs so linked were not free.
func linkReason(link string, count int) string {
	what := "NVLink-peer"
	if link == LinkNUMA {
		what = "same-NUMA"
	}
	return fmt.Sprintf("gpu_link %s: no %d %s healthy GPUs free", link, count, what)
}

// gib is a gigabyte as min_gpu_memory_gb counts it: GPU makers' "80GB"
// is 80 GiB of memory (NVML reports 85,520,809,984 bytes for an H100 80GB,
// a little under 80 GiB; see minMemoryBytes).
const gib = 1 << 30

// any reports whether c constrains anything.
func (c *Constraints) any() bool {
	return c != nil && (len(c.NodeSelector) > 0 || len(c.GPUModels) > 0 || c.MinGPUMemoryGB > 0 || c.GPULink != "" || c.NVLinkDomain != "")
}

// gpuWise reports whether c looks at GPUs, not only at the node.
func (c *Constraints) gpuWise() bool { return len(c.GPUModels) > 0 || c.MinGPUMemoryGB > 0 }

// minMemoryBytes is the least memory a GPU needs. NVML reports a little
// less than the marketed size (an "80GB" H100: 79.6 GiB; driver
// reservations), so a GPU within 1 GiB of the asked size counts.
func (c *Constraints) minMemoryBytes() uint64 {
	if c.MinGPUMemoryGB <= 1 {
		return uint64(c.MinGPUMemoryGB * gib * 0.5)
	}
	return uint64((c.MinGPUMemoryGB - 1) * gib)
}

// nodeOK reports whether n's labels match the selector.
func (c *Constraints) nodeOK(n *Node) bool {
	for k, v := range c.NodeSelector {
		if have, ok := n.Labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// gpuOK reports whether GPU g of n is of an allowed model and has the
// memory asked. A node that does not say (an rlightning cluster file)
// matches no GPU constraint.
func (c *Constraints) gpuOK(n *Node, g int) bool {
	if len(c.GPUModels) > 0 && (g >= len(n.Models) || !c.modelOK(n.Models[g])) {
		return false
	}
	if c.MinGPUMemoryGB > 0 && (g >= len(n.MemoryBytes) || n.MemoryBytes[g] < c.minMemoryBytes()) {
		return false
	}
	return true
}

// modelOK reports whether a GPU named name (NVML's name) is of one of
// the models asked.
func (c *Constraints) modelOK(name string) bool {
	return slices.ContainsFunc(c.GPUModels, func(m string) bool { return modelMatch(name, m) })
}

// modelMatch reports whether model (a short name, "H100", or several
// words, "H100 80GB") names GPU name (NVML's, "NVIDIA H100 80GB HBM3"):
// its words, case aside, are whole words of the name in a row, words
// being split at spaces and dashes. So A10 is not an A100, L4 not an
// L40S, B200 not a GB200. It does not allocate: it runs for every GPU a
// constrained group looks at.
func modelMatch(name, model string) bool {
	model = strings.TrimSpace(model)
	for i := 0; i+len(model) <= len(name); i++ {
		if (i == 0 || isSep(name[i-1])) && strings.EqualFold(name[i:i+len(model)], model) &&
			(i+len(model) == len(name) || isSep(name[i+len(model)])) {
			return true
		}
	}
	return false
}

func isSep(b byte) bool { return b == ' ' || b == '-' }

// nodeReason is the reason a node is passed over for its labels.
func (c *Constraints) nodeReason() string {
	keys := slices.Sorted(maps.Keys(c.NodeSelector))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + c.NodeSelector[k]
	}
	return "node_selector " + strings.Join(parts, ",") + " does not match the node's labels"
}

// gpuReason is the reason a node is passed over for its GPUs.
func (c *Constraints) gpuReason() string {
	var what []string
	if len(c.GPUModels) > 0 {
		what = append(what, fmt.Sprintf("gpu_model %v", c.GPUModels))
	}
	if c.MinGPUMemoryGB > 0 {
		what = append(what, fmt.Sprintf("min_gpu_memory_gb %g", c.MinGPUMemoryGB))
	}
	return strings.Join(what, ", ") + " matches no healthy GPU"
}

// pickLinked is pick for a worker of count GPUs whose group says how
// they must be linked: held is nil when no such GPUs are free, and why
// says so when plain GPUs would have been; compromise is set when
// prefer-nvlink settled for less.
func (e *engine) pickLinked(ns *nodeState, ci comp, gi int, gpus []int, pos *int, count int) (held []int, why string, compromise bool) {
	c := e.cons[ci][gi]
	link := ""
	if c != nil {
		link = c.GPULink
	}
	if link == "" || link == LinkAny {
		return e.pick(ns, ci, gpus, pos, count, 1), "", false
	}
	var free []int
	for _, g := range gpus[*pos:] {
		if e.fits(ns, ci, g, 1) {
			free = append(free, g)
		}
	}
	if len(free) < count {
		return nil, "", false
	}
	n := ns.node
	switch link {
	case LinkNVLink:
		held = clique(free, count, n.Peers)
	case LinkNUMA:
		held = sameNUMA(free, count, n.NUMA)
	case LinkPreferNVLink:
		if held = clique(free, count, n.Peers); held == nil {
			if held = sameNUMA(free, count, n.NUMA); held == nil {
				held = free[:count:count]
			}
			compromise = true
		}
	}
	if held == nil {
		return nil, linkReason(link, count), false
	}
	return held, "", compromise
}

// clique is count GPUs of free, pairwise NVLink peers (the first such
// set in free's order, by a search that backtracks: a node's NVLink
// matrix may have holes); nil if there are none.
func clique(free []int, count int, peers []uint64) []int {
	held := make([]int, 0, count)
	var search func(from int) bool
	search = func(from int) bool {
		if len(held) == count {
			return true
		}
		for i := from; i <= len(free)-(count-len(held)); i++ {
			b := free[i]
			ok := b < len(peers)
			for _, h := range held {
				ok = ok && peers[h]&(1<<b) != 0 && peers[b]&(1<<h) != 0
			}
			if !ok {
				continue
			}
			held = append(held, b)
			if search(i + 1) {
				return true
			}
			held = held[:len(held)-1]
		}
		return false
	}
	if search(0) {
		return held
	}
	return nil
}

// sameNUMA is count GPUs of free on one known NUMA node; nil if there
// are none.
func sameNUMA(free []int, count int, numa []int) []int {
	by := map[int][]int{}
	for _, g := range free {
		if g < len(numa) && numa[g] >= 0 {
			by[numa[g]] = append(by[numa[g]], g)
			if len(by[numa[g]]) == count {
				return by[numa[g]]
			}
		}
	}
	return nil
}

// linked reports whether gpus are linked as link asks (kept workers).
func linked(n *Node, gpus []int, link string) bool {
	switch link {
	case LinkNVLink:
		return clique(gpus, len(gpus), n.Peers) != nil
	case LinkNUMA:
		return sameNUMA(gpus, len(gpus), n.NUMA) != nil
	}
	return true
}

// constrained reports whether any group of the spec has constraints.
func (e *engine) constrained() bool {
	for _, cs := range e.cons {
		for _, c := range cs {
			if c.any() {
				return true
			}
		}
	}
	return false
}

// byUnits reports whether the run places by units (units.go): a spec
// with constraints, or a search.
func (e *engine) byUnits() bool { return e.unitMode || e.constrained() }
