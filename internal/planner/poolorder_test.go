package planner

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// poolOrderByMaps is poolOrder as it was, with every node of both
// orders in a map: the reference the walk in step must agree with.
func poolOrderByMaps(name string, was, now []plan.PoolNode) plan.PoolOrder {
	po := plan.PoolOrder{Name: name}
	in := make(map[string]bool, len(now))
	for _, n := range now {
		in[n.NodeID] = true
	}
	old := make(map[string]bool, len(was))
	k := 0
	for _, n := range was {
		old[n.NodeID] = true
		switch {
		case !in[n.NodeID]:
			po.Drop = append(po.Drop, n.NodeID)
		case k < len(now) && now[k].NodeID == n.NodeID:
			k++
		default:
			return wholeOrder(name, plan.NewPoolNodes(now))
		}
	}
	for _, n := range now[k:] {
		if old[n.NodeID] {
			return wholeOrder(name, plan.NewPoolNodes(now))
		}
		po.Add = append(po.Add, n.NodeID)
	}
	return po
}

// TestPoolOrderIsByMaps: for orders changed as replans change them
// (nodes dropped, added at the end) and otherwise (moved, repeated),
// poolOrder says what the map-based reference says.
func TestPoolOrderIsByMaps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfN(rapid.IntRange(0, 30), 0, 25).Draw(t, "was")
		was := make([]plan.PoolNode, len(ids))
		for i, id := range ids {
			was[i] = plan.PoolNode{NodeID: fmt.Sprint("n", id)}
		}
		var now []plan.PoolNode
		for _, n := range was {
			if rapid.IntRange(0, 4).Draw(t, "keep") > 0 {
				now = append(now, n)
			}
		}
		for range rapid.IntRange(0, 3).Draw(t, "added") {
			now = append(now, plan.PoolNode{NodeID: fmt.Sprint("n", rapid.IntRange(0, 40).Draw(t, "new"))})
		}
		if len(now) > 1 && rapid.IntRange(0, 3).Draw(t, "swap") == 0 {
			i, j := rapid.IntRange(0, len(now)-1).Draw(t, "i"), rapid.IntRange(0, len(now)-1).Draw(t, "j")
			now[i], now[j] = now[j], now[i]
		}
		got, want := poolOrder("p", plan.NewPoolNodes(was), plan.NewPoolNodes(now)), poolOrderByMaps("p", was, now)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("was %v now %v:\n got %+v\nwant %+v", was, now, got, want)
		}
	})
}
