package plan

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// Summary is what a reader that lists plans (planner status) needs of a
// revision beyond its header: how many workers it places on each node
// and which GPUs of the node they use. It is a small fraction of the
// document (a few hundred bytes for 20,000 numbered nodes held alike,
// against tens of megabytes for the whole placement), so that such a
// reader need not rebuild 400,000 workers to count them; and a change
// event (its nodes whole) applies to it (SummaryBuilder).
type Summary struct {
	Name     string `json:"name"`
	Revision int    `json:"revision"`
	// Seq is the stream sequence of the revision's event: a summary
	// speaks for that event only, so a reader that finds another event
	// latest knows it is not the latest's.
	Seq     uint64 `json:"seq"`
	Workers int    `json:"workers"`
	// Held groups the nodes the plan's workers are on by which of their
	// GPUs they use (wholly or in part, each GPU once) and how many
	// workers are there.
	Held []HeldGPUs `json:"held"`
}

// HeldGPUs is a set of nodes on each of which the plan has the same
// number of workers (Workers), using the same GPUs (node-local indices;
// none for workers without GPUs): Nodes, numbered series of node ids
// folded into runs.
type HeldGPUs struct {
	GPUs    []Range   `json:"gpus"`
	Workers int       `json:"workers"`
	Nodes   []NodeRun `json:"nodes"`
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

// maxNodeWorkers bounds the workers a summary says one node holds (a
// plan of 1,000 workers per GPU on 64 GPUs is far below it).
const maxNodeWorkers = 1 << 20

// SummaryOf summarizes d; seq is its event's stream sequence (0 when it
// has none). It costs a map lookup per node, not per worker, where a
// node's workers follow one another, and no sort by CompareNodeIDs.
func SummaryOf(d *Document, seq uint64) *Summary {
	nodes := 0
	for _, pl := range d.Pools {
		nodes += pl.Nodes.Len()
	}
	b := SummaryBuilder{at: make(map[string]int, nodes), nodes: make([]heldNode, 0, nodes)}
	last, at := "", -1
	for _, w := range d.Workers.All() {
		if at < 0 || w.NodeID != last {
			last, at = w.NodeID, b.node(w.NodeID)
		}
		b.nodes[at].workers++
		b.add(at, w.GPUs)
	}
	return b.Summary(d.Name, d.Revision, seq)
}

// SummaryBuilder makes a Summary node by node: from a document's
// workers (SummaryOf), or from a summary with the nodes of the change
// events after it set again (what a reader of a chain of changes does).
// Its zero value is empty.
type SummaryBuilder struct {
	at    map[string]int
	nodes []heldNode
}

// heldNode is one node's workers and GPUs used: a bit per GPU below 64
// (every GPU of every node made so far), the rest listed.
type heldNode struct {
	id      string
	mask    uint64
	more    []int
	workers int
	gone    bool
}

// Set makes node's entry workers workers using gpus (node-local
// indices, in any order, repeated or not), whatever it was; a node with
// no workers is left out.
func (b *SummaryBuilder) Set(node string, workers int, gpus []int) {
	i := b.node(node)
	b.nodes[i] = heldNode{id: node, workers: workers, gone: workers == 0}
	b.add(i, gpus)
}

func (b *SummaryBuilder) node(id string) int {
	if b.at == nil {
		b.at = map[string]int{}
	}
	i, ok := b.at[id]
	if !ok {
		i = len(b.nodes)
		b.at[id] = i
		b.nodes = append(b.nodes, heldNode{id: id})
	}
	return i
}

func (b *SummaryBuilder) add(i int, gpus []int) {
	n := &b.nodes[i]
	for _, g := range gpus {
		if g >= 0 && g < 64 {
			n.mask |= 1 << g
		} else {
			n.more = append(n.more, g)
		}
	}
}

// gpus is the node's GPUs as ranges.
func (n *heldNode) gpus() []Range {
	all := slices.Clone(n.more)
	for m := n.mask; m != 0; m &= m - 1 {
		all = append(all, bits.TrailingZeros64(m))
	}
	slices.Sort(all)
	return RangesOf(slices.Compact(all))
}

// numbered is a node id split at its last number, for folding.
type numbered struct {
	id, stem, suffix, digits string
	n                        uint64
	ok                       bool
}

func numberedOf(id string) numbered {
	start, digits, end, ok := lastNumber(id)
	x := numbered{id: id}
	if !ok {
		return x
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return x
	}
	x.stem, x.suffix, x.digits, x.n, x.ok = id[:start], id[end:], digits, n, true
	return x
}

// follows is Follows(a.id, x.id), from their parts: x is NextNodeID(a).
func (x *numbered) follows(a *numbered) bool {
	if !x.ok || !a.ok || a.n == ^uint64(0) || x.n != a.n+1 || x.stem != a.stem || x.suffix != a.suffix {
		return false
	}
	if len(a.digits) > 1 && a.digits[0] == '0' {
		return len(x.digits) == len(a.digits)
	}
	return x.digits[0] != '0'
}

// Summary is the summary of the nodes set so far, as revision rev of
// plan name whose event is at seq.
func (b *SummaryBuilder) Summary(name string, rev int, seq uint64) *Summary {
	s := &Summary{Name: name, Revision: rev, Seq: seq, Held: []HeldGPUs{}}
	// Nodes alike (by their GPUs' set and workers) together, in an
	// order of that set's text, each set's nodes by stem and number so
	// that runs lie side by side.
	type entry struct {
		key     string
		workers int
		numbered
	}
	entries := make([]entry, 0, len(b.nodes))
	sets := map[string][]Range{}
	byMask := map[uint64]string{}
	for i := range b.nodes {
		n := &b.nodes[i]
		if n.gone || n.workers == 0 {
			continue
		}
		s.Workers += n.workers
		key, ok := byMask[n.mask]
		if !ok || n.more != nil {
			rs := n.gpus()
			key = FormatRanges(rs)
			if _, seen := sets[key]; !seen {
				sets[key] = rs
			}
			if n.more == nil {
				byMask[n.mask] = key
			}
		}
		entries = append(entries, entry{key: key, workers: n.workers, numbered: numberedOf(n.id)})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(strings.Compare(a.key, b.key), cmp.Compare(a.workers, b.workers), strings.Compare(a.stem, b.stem), strings.Compare(a.suffix, b.suffix),
			cmp.Compare(a.n, b.n), cmp.Compare(len(a.digits), len(b.digits)), strings.Compare(a.id, b.id))
	})
	for i := 0; i < len(entries); {
		key, workers := entries[i].key, entries[i].workers
		h := HeldGPUs{GPUs: sets[key], Workers: workers}
		if h.GPUs == nil {
			h.GPUs = []Range{}
		}
		alike := func(e *entry) bool { return e.key == key && e.workers == workers }
		for i < len(entries) && alike(&entries[i]) {
			j := i + 1
			for j < len(entries) && alike(&entries[j]) && entries[j].follows(&entries[j-1].numbered) {
				j++
			}
			h.Nodes = append(h.Nodes, NodeRun{First: entries[i].id, Count: j - i})
			i = j
		}
		s.Held = append(s.Held, h)
	}
	return s
}

// Each calls fn with every node the plan has workers on, how many, and
// the ranges of the GPUs they use (shared between nodes: do not change
// them), until fn returns false. A summary that cannot be expanded (a
// run past the end of its series, a bad range, too many nodes, worker
// counts that do not add up) is an error naming what is wrong.
func (s *Summary) Each(fn func(node string, workers int, gpus []Range) bool) error {
	if err := s.check(); err != nil {
		return err
	}
	for i, h := range s.Held {
		for _, run := range h.Nodes {
			id := run.First
			for k := range run.Count {
				if k > 0 {
					next, ok := NextNodeID(id)
					if !ok {
						return fmt.Errorf("summary of plan %s revision %d: held[%d].nodes: run from %q of %d: %q has no next node id", s.Name, s.Revision, i, run.First, run.Count, id)
					}
					id = next
				}
				if !fn(id, h.Workers, h.GPUs) {
					return nil
				}
			}
		}
	}
	return nil
}

// check is what Each checks before it expands the runs.
func (s *Summary) check() error {
	total, workers := 0, 0
	for i, h := range s.Held {
		for _, r := range h.GPUs {
			if r.First < 0 || r.Last < r.First {
				return fmt.Errorf("summary of plan %s revision %d: held[%d].gpus: range [%d, %d]: want 0 <= first <= last", s.Name, s.Revision, i, r.First, r.Last)
			}
		}
		if h.Workers < 1 || h.Workers > maxNodeWorkers {
			return fmt.Errorf("summary of plan %s revision %d: held[%d].workers: %d: want 1 to %d", s.Name, s.Revision, i, h.Workers, maxNodeWorkers)
		}
		for _, run := range h.Nodes {
			if run.Count < 1 || run.First == "" {
				return fmt.Errorf("summary of plan %s revision %d: held[%d].nodes: run %q of %d: want a node id and a count of at least 1", s.Name, s.Revision, i, run.First, run.Count)
			}
			if total += run.Count; total > maxSummaryNodes {
				return fmt.Errorf("summary of plan %s revision %d: held: over %d nodes", s.Name, s.Revision, maxSummaryNodes)
			}
			workers += run.Count * h.Workers
		}
	}
	if workers != s.Workers {
		return fmt.Errorf("summary of plan %s revision %d: workers: %d, but its nodes hold %d", s.Name, s.Revision, s.Workers, workers)
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
