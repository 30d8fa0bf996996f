package plan

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Summary is what a reader that lists plans (planner status) needs of a
// revision beyond its header: how many workers it places and which GPUs
// of each node they use. It is a small fraction of the document (a few
// hundred bytes for 20,000 numbered nodes held alike, against tens of
// megabytes for the whole placement), so that such a reader need not
// rebuild 400,000 workers to count them.
type Summary struct {
	Name     string `json:"name"`
	Revision int    `json:"revision"`
	// Seq is the stream sequence of the revision's event: a summary
	// speaks for that event only, so a reader that finds another event
	// latest knows it is not the latest's.
	Seq     uint64 `json:"seq"`
	Workers int    `json:"workers"`
	// Held groups the nodes the plan's workers use by which of their
	// GPUs they use (wholly or in part, each GPU once).
	Held []HeldGPUs `json:"held"`
}

// HeldGPUs is a set of nodes on each of which the plan's workers use the
// same GPUs: GPUs (node-local indices), on Nodes, numbered series of
// node ids folded into runs.
type HeldGPUs struct {
	GPUs  []Range   `json:"gpus"`
	Nodes []NodeRun `json:"nodes"`
}

// NodeRun is Count node ids from First on, each the NextNodeID of the
// one before (so a run's ids Follow one another).
type NodeRun struct {
	First string `json:"first"`
	Count int    `json:"count"`
}

// maxSummaryNodes bounds what a summary may expand to, so that a damaged
// or hostile one costs its reader an error, not its memory.
const maxSummaryNodes = 1 << 22

// SummaryOf summarizes d; seq is its event's stream sequence (0 when it
// has none).
func SummaryOf(d *Document, seq uint64) *Summary {
	byNode := map[string][]int{}
	for _, w := range d.Workers.All() {
		if len(w.GPUs) > 0 {
			byNode[w.NodeID] = append(byNode[w.NodeID], w.GPUs...)
		}
	}
	return SummaryFrom(d.Name, d.Revision, seq, d.Workers.Len(), byNode)
}

// SummaryFrom makes a summary of held, each node's GPUs used (in any
// order, repeated or not), which it may reorder.
func SummaryFrom(name string, rev int, seq uint64, workers int, held map[string][]int) *Summary {
	s := &Summary{Name: name, Revision: rev, Seq: seq, Workers: workers, Held: []HeldGPUs{}}
	groups := map[string][]string{}
	sets := map[string][]Range{}
	for node, gpus := range held {
		slices.Sort(gpus)
		rs := RangesOf(slices.Compact(gpus))
		key := FormatRanges(rs)
		if _, ok := sets[key]; !ok {
			sets[key] = rs
		}
		groups[key] = append(groups[key], node)
	}
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		nodes := groups[key]
		slices.SortFunc(nodes, CompareNodeIDs)
		h := HeldGPUs{GPUs: sets[key]}
		for i := 0; i < len(nodes); {
			j := i + 1
			for j < len(nodes) && nodes[j] == nextOr(nodes[j-1]) {
				j++
			}
			h.Nodes = append(h.Nodes, NodeRun{First: nodes[i], Count: j - i})
			i = j
		}
		s.Held = append(s.Held, h)
	}
	return s
}

// nextOr is id's NextNodeID, or "" when it has none (no node id is
// empty, so nothing matches it).
func nextOr(id string) string {
	next, _ := NextNodeID(id)
	return next
}

// Each calls fn with every node the summary holds GPUs on and those GPUs'
// ranges (shared between nodes: do not change them), until fn returns
// false. A summary that cannot be expanded (a run past the end of its
// series, a bad range, too many nodes) is an error naming what is wrong.
func (s *Summary) Each(fn func(node string, gpus []Range) bool) error {
	total := 0
	for i, h := range s.Held {
		for _, r := range h.GPUs {
			if r.First < 0 || r.Last < r.First {
				return fmt.Errorf("summary of plan %s revision %d: held[%d].gpus: range [%d, %d]: want 0 <= first <= last", s.Name, s.Revision, i, r.First, r.Last)
			}
		}
		for _, run := range h.Nodes {
			if run.Count < 1 || run.First == "" {
				return fmt.Errorf("summary of plan %s revision %d: held[%d].nodes: run %q of %d: want a node id and a count of at least 1", s.Name, s.Revision, i, run.First, run.Count)
			}
			if total += run.Count; total > maxSummaryNodes {
				return fmt.Errorf("summary of plan %s revision %d: held: over %d nodes", s.Name, s.Revision, maxSummaryNodes)
			}
			id := run.First
			for k := range run.Count {
				if k > 0 {
					next, ok := NextNodeID(id)
					if !ok {
						return fmt.Errorf("summary of plan %s revision %d: held[%d].nodes: run from %q of %d: %q has no next node id", s.Name, s.Revision, i, run.First, run.Count, id)
					}
					id = next
				}
				if !fn(id, h.GPUs) {
					return nil
				}
			}
		}
	}
	return nil
}

// NextNodeID is the id that Follows id: its last number one more,
// written as wide when zero-padded. False when id has no number, or its
// last number cannot grow within its width or a uint64.
func NextNodeID(id string) (string, bool) {
	start, digits, end, ok := lastNumber(id)
	if !ok {
		return "", false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n == ^uint64(0) {
		return "", false
	}
	next := strconv.FormatUint(n+1, 10)
	// A zero-padded number below its width's limit: n+1 never needs
	// more digits than it has.
	if pad := len(digits) - len(next); pad > 0 {
		next = strings.Repeat("0", pad) + next
	}
	return id[:start] + next + id[end:], true
}
