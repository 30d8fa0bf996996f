package inventory

import "sync"

// maxShared bounds a Strings table: past it, or for a value longer than
// maxSharedLen, a document gets a copy of its own, so that hostile or
// unusual values (every node a different driver string) cost what they
// did without the table.
const (
	maxShared    = 4096
	maxSharedLen = 128
)

// Strings holds one copy of each string inventory documents repeat from
// node to node (GPU models, PCI bus ids, driver versions, the reporter,
// the fabric's cluster, label keys and values), for the documents
// DecodeShared reads: at 20,000 nodes of 8 GPUs each model name and bus
// id was otherwise held 160,000 times (9 MB of the planner's live heap
// at a cold start). Safe for concurrent use: a store's read-ahead
// decodes on several goroutines. A nil *Strings shares nothing.
//
// It holds, the same way, the GPUs' NVLink peer lists (a node's GPU i
// lists the same peers as GPU i of every node like it: 160,000 lists of
// 7 at 20,000 nodes, 16 MB, are a handful) and NUMA nodes. Documents
// share these read-only: nothing changes a decoded document's lists or
// NUMA node in place, and each list's capacity is its length, so an
// append copies.
type Strings struct {
	mu    sync.Mutex
	m     map[string]string
	peers map[string][]int // by the list's JSON text
	numas map[int]*int
}

// NewStrings makes an empty table.
func NewStrings() *Strings {
	return &Strings{m: map[string]string{}, peers: map[string][]int{}, numas: map[int]*int{}}
}

// ints is the list vals, decoded from the JSON text raw: the table's
// copy where it has one or takes one. Never nil, as encoding/json
// decodes [] (present, empty).
func (t *Strings) ints(raw []byte, vals []int) []int {
	if t == nil || len(raw) > maxSharedLen {
		return append(make([]int, 0, len(vals)), vals...)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.peers[string(raw)]; ok {
		return s
	}
	s := append(make([]int, 0, len(vals)), vals...)
	if len(t.peers) < maxShared {
		t.peers[string(raw)] = s
	}
	return s
}

// numa is a pointer to n, the table's where it has one or takes one.
func (t *Strings) numa(n int) *int {
	if t == nil {
		return &n
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.numas[n]; ok {
		return p
	}
	p := &n
	if len(t.numas) < maxShared {
		t.numas[n] = p
	}
	return p
}

// of is b as a string, the table's copy where it has one or takes one.
// ints and of each look up by string(...) inline, which allocates
// nothing (a generic helper taking the key would make one per lookup,
// a million at a 20,000-node start).
func (t *Strings) of(b []byte) string {
	if t == nil || len(b) > maxSharedLen {
		return string(b)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(t.m) < maxShared {
		t.m[s] = s
	}
	return s
}
