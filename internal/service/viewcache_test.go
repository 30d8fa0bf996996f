package service

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

func TestPatched(t *testing.T) {
	at := func(id string) string { return "new:" + id }
	for _, tc := range []struct {
		name                 string
		oldIDs, ids, touched []string
		want                 []string
	}{
		{"unchanged", []string{"a", "b"}, []string{"a", "b"}, nil, []string{"old:a", "old:b"}},
		{"one changed", []string{"a", "b", "c"}, []string{"a", "b", "c"}, []string{"b"}, []string{"old:a", "new:b", "old:c"}},
		{"one left", []string{"a", "b", "c"}, []string{"a", "c"}, []string{"b"}, []string{"old:a", "old:c"}},
		{"first left", []string{"a", "b"}, []string{"b"}, []string{"a"}, []string{"old:b"}},
		{"last left", []string{"a", "b"}, []string{"a"}, []string{"b"}, []string{"old:a"}},
		{"one joined", []string{"a", "c"}, []string{"a", "b", "c"}, []string{"b"}, []string{"old:a", "new:b", "old:c"}},
		{"joined at the end", []string{"a"}, []string{"a", "z"}, []string{"z"}, []string{"old:a", "new:z"}},
		{"from empty", nil, []string{"a"}, []string{"a"}, []string{"new:a"}},
		{"to empty", []string{"a"}, []string{}, []string{"a"}, []string{}},
		{"left and joined", []string{"a", "b"}, []string{"a", "c"}, []string{"b", "c"}, []string{"old:a", "new:c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := make([]string, len(tc.oldIDs))
			for i, id := range tc.oldIDs {
				old[i] = "old:" + id
			}
			if got := patched(tc.oldIDs, old, tc.ids, tc.touched, at); !slices.Equal(got, tc.want) {
				t.Fatalf("patched = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestViewCacheProperty: whatever a view goes through (nodes joining,
// leaving, changing, their processes alone changing, drains), the
// slices it patches from its last ones are those read from its maps
// whole.
func TestViewCacheProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		v := newView()
		ids := make([]string, 12)
		for i := range ids {
			ids[i] = fmt.Sprintf("n%02d", i)
		}
		doc := func(id string) inventory.NodeInventory {
			d := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}.Inventory()
			sim, err := inventory.ParseSimulation(fmt.Sprintf("%dxH100", rapid.IntRange(1, 4).Draw(rt, "gpus")))
			if err != nil {
				rt.Fatal(err)
			}
			d.GPUs = inventory.SimulatedGPUs(id, sim)
			for i := range d.GPUs {
				d.GPUs[i].Healthy = rapid.Bool().Draw(rt, "healthy")
			}
			return d
		}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for range steps {
			id := rapid.SampledFrom(ids).Draw(rt, "node")
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0, 1:
				if _, err := v.put(id, doc(id)); err != nil {
					rt.Fatalf("put %s: %v", id, err)
				}
			case 2:
				v.remove(id)
			case 3:
				if d, ok := v.doc(id); ok && len(d.GPUs) > 0 {
					d.GPUs = slices.Clone(d.GPUs)
					d.GPUs[0].Processes = []inventory.Process{{PID: rapid.Uint32().Draw(rt, "pid")}}
					if _, err := v.put(id, d); err != nil {
						rt.Fatalf("put %s: %v", id, err)
					}
				}
			case 4:
				v.setOut(id, nodeOut{whole: rapid.Bool().Draw(rt, "whole"), gpus: []int{0}})
			}
			if rapid.Bool().Draw(rt, "read nodes") {
				checkNodes(rt, &v)
			}
			if rapid.Bool().Draw(rt, "read docs") {
				checkDocs(rt, &v)
			}
		}
		checkNodes(rt, &v)
		checkDocs(rt, &v)
	})
}

func checkNodes(rt *rapid.T, v *view) {
	want := make([]planner.Node, len(v.ids))
	for i, id := range v.ids {
		want[i] = v.nodes[id]
	}
	if got := v.planNodes(); !reflect.DeepEqual(got, want) {
		rt.Fatalf("planNodes (generation %d):\n got %v\nwant %v", v.gen, got, want)
	}
}

func checkDocs(rt *rapid.T, v *view) {
	want := make([]inventory.NodeInventory, len(v.docIDs))
	for i, id := range v.docIDs {
		want[i] = v.docs[id]
	}
	if got := v.sortedDocs(); !reflect.DeepEqual(got, want) {
		rt.Fatalf("sortedDocs (generation %d):\n got %v\nwant %v", v.gen, got, want)
	}
}
