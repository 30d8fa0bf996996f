package service

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/internal/inventory"
)

// recount is inventorySize as it was before tally: every document's
// GPUs, each time.
func recount(v *view) (unhealthy, conflicts int) {
	for id, doc := range v.docs {
		unhealthy += len(doc.GPUs) - len(doc.HealthyGPUs())
		for _, g := range doc.GPUs {
			if g.Healthy {
				continue
			}
			if h := v.claims.Holder(g.UUID); h != "" && h != id {
				conflicts++
			}
		}
	}
	return unhealthy, conflicts
}

// TestTallyMatchesRecount: however documents come and go, and UUIDs
// pass from node to node (a few shared among many nodes, so that claims
// refuse and hand over), the kept tally is what counting every document
// again says, and the sorted ids kept are the documents'.
func TestTallyMatchesRecount(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := newView()
		ids := []string{"a", "b", "c", "d"}
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			id := rapid.SampledFrom(ids).Draw(t, "node")
			if rapid.IntRange(0, 3).Draw(t, "leave") == 0 {
				v.remove(id)
			} else {
				inv := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 8}.Inventory()
				for g := range rapid.IntRange(0, 3).Draw(t, "gpus") {
					inv.GPUs = append(inv.GPUs, inventory.GPU{
						Index:   g,
						UUID:    fmt.Sprintf("GPU-%d", rapid.IntRange(0, 5).Draw(t, "uuid")),
						Name:    "NVIDIA H100",
						Healthy: rapid.Bool().Draw(t, "healthy"),
					})
				}
				_, _ = v.put(id, inv)
			}
			if want := slices.Sorted(maps.Keys(v.docs)); !slices.Equal(v.docIDs, want) {
				t.Fatalf("step %d: document ids %v, want %v", step, v.docIDs, want)
			}
			u, c := recount(&v)
			if v.tally.unhealthy != u || v.tally.conflicts != c {
				t.Fatalf("step %d: tally %d unhealthy, %d refused; recount %d, %d", step, v.tally.unhealthy, v.tally.conflicts, u, c)
			}
		}
	})
}
