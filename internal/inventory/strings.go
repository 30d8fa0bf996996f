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
type Strings struct {
	mu sync.Mutex
	m  map[string]string
}

// NewStrings makes an empty table.
func NewStrings() *Strings { return &Strings{m: map[string]string{}} }

// of is b as a string, the table's copy where it has one or takes one.
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
