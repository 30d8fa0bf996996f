package planner

import (
	"runtime"
	"testing"
)

// TestFreshCostPerNode: a plan of 8 workers made afresh on a free
// cluster (a shrink's taker) costs at most perNode bytes for each node it
// leaves alone: one state of 120 bytes and a few words of the run's
// walks over the nodes (177 in all). It was 590 bytes with the node list
// copied and states of 240 bytes, 310 with the copy gone, 222 with the
// list of nodes with room grown by append, 211 with states of 152 bytes.
func TestFreshCostPerNode(t *testing.T) {
	const n, perNode = 5000, 185
	nodes, _ := benchCluster(n)
	job := takerJob(8)
	run := func() {
		if o := PlanAll([]Job{job}, nodes)[0]; o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	run() // anything made once, not per run
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 4
	for range runs {
		run()
	}
	runtime.ReadMemStats(&after)
	got := (after.TotalAlloc - before.TotalAlloc) / runs / n
	t.Logf("%d bytes per node", got)
	if got > perNode {
		t.Fatalf("a plan of 8 workers on %d nodes allocates %d bytes per node, want at most %d", n, got, perNode)
	}
}
