package planner

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// movedByIndex is CountMoved as it is defined: every worker of next not
// found, by component and index, where prev has it (the last of prev's
// repeats counts).
func movedByIndex(prev, next *Plan) int {
	old := indexWorkers(prev.Workers)
	n := 0
	for _, w := range next.Workers.All() {
		if o := old.get(w.Component, w.Index); o == nil || !samePlace(o, w) {
			n++
		}
	}
	return n
}

// genWorkers is a worker list in the planner's order, or now and then
// shuffled, with repeats or odd indices.
func genWorkers(t *rapid.T, label string) *Plan {
	var ws []plan.Worker
	for _, c := range []plan.Component{plan.Train, plan.Eval, plan.Env, plan.Buffer} {
		for i := range rapid.IntRange(0, 6).Draw(t, fmt.Sprintf("%s.%s", label, c)) {
			ws = append(ws, plan.Worker{Component: c, Index: i,
				NodeID: fmt.Sprintf("n%d", rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("%s.%s%d.node", label, c, i))),
				GPUs:   []int{rapid.IntRange(0, 1).Draw(t, fmt.Sprintf("%s.%s%d.gpu", label, c, i))}})
		}
	}
	switch rapid.IntRange(0, 5).Draw(t, label+".disorder") {
	case 0:
		if len(ws) > 1 {
			i, j := rapid.IntRange(0, len(ws)-1).Draw(t, label+".i"), rapid.IntRange(0, len(ws)-1).Draw(t, label+".j")
			ws[i], ws[j] = ws[j], ws[i]
		}
	case 1:
		if len(ws) > 0 {
			k := rapid.IntRange(0, len(ws)-1).Draw(t, label+".repeat")
			w := ws[k]
			w.NodeID += "x"
			ws = slices.Insert(ws, rapid.IntRange(0, len(ws)).Draw(t, label+".at"), w)
		}
	case 2:
		if len(ws) > 0 {
			ws[rapid.IntRange(0, len(ws)-1).Draw(t, label+".odd")].Index = -1
		}
	}
	p := &Plan{}
	p.Workers = plan.NewWorkers(ws)
	return p
}

// TestCountMovedInOrder: CountMoved's walk over two lists in order
// counts what its definition counts, and lists out of order, repeated or
// odd are counted by the definition itself.
func TestCountMovedInOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prev, next := genWorkers(t, "prev"), genWorkers(t, "next")
		if got, want := CountMoved(prev, next), movedByIndex(prev, next); got != want {
			t.Fatalf("moved %d, want %d\nprev %s\nnext %s", got, want, placementOf(prev), placementOf(next))
		}
	})
}

// TestCountMovedShared: CountMoved of plans whose states know their
// workers in order, sharing the chunks a replan left alone, counts what
// its definition counts; workersInOrder, which reads only the ends of a
// chunk shared with a list known in order, says what a full walk says.
func TestCountMovedShared(t *testing.T) {
	fullInOrder := func(ws plan.Workers) bool {
		last := -1
		for _, w := range ws.All() {
			k, ok := orderKey(w)
			if !ok || k <= last {
				return false
			}
			last = k
		}
		return true
	}
	rapid.Check(t, func(t *rapid.T) {
		worker := func(c plan.Component, i int, label string) plan.Worker {
			return plan.Worker{Component: c, Index: i, NodeID: fmt.Sprintf("n%d", rapid.IntRange(0, 3).Draw(t, label+".node")),
				GPUs: []int{rapid.IntRange(0, 1).Draw(t, label+".gpu")}}
		}
		// Indices with gaps (a degraded plan's) leave keys prev lacks
		// between those it has.
		step := rapid.IntRange(1, 2).Draw(t, "step")
		var ws []plan.Worker
		for _, c := range []plan.Component{plan.Train, plan.Eval} {
			for i := range rapid.IntRange(0, 3*chunkLen).Draw(t, "prev."+string(c)) {
				ws = append(ws, plan.Worker{Component: c, Index: step * i, NodeID: fmt.Sprintf("n%d", i%3), GPUs: []int{i % 2}})
			}
		}
		if len(ws) > 0 && rapid.IntRange(0, 5).Draw(t, "prev.disorder") == 0 {
			i, j := rapid.IntRange(0, len(ws)-1).Draw(t, "prev.i"), rapid.IntRange(0, len(ws)-1).Draw(t, "prev.j")
			ws[i], ws[j] = ws[j], ws[i]
		}
		prev := &Plan{state: &runState{}}
		prev.Workers = plan.NewWorkers(ws)
		if workersInOrder(prev.Workers, plan.Workers{}) != fullInOrder(prev.Workers) {
			t.Fatalf("prev: workersInOrder %v, a full walk %v", !fullInOrder(prev.Workers), fullInOrder(prev.Workers))
		}

		next := slices.Clone(ws)
		for range rapid.IntRange(0, 4).Draw(t, "edits") {
			switch rapid.IntRange(0, 7).Draw(t, "edit") {
			case 0, 1: // a worker moved
				if len(next) > 0 {
					k := rapid.IntRange(0, len(next)-1).Draw(t, "moved")
					next[k] = worker(next[k].Component, next[k].Index, "moved")
				}
			case 2: // grown
				c := plan.Eval
				if len(next) > 0 {
					c = next[len(next)-1].Component
				}
				next = append(next, worker(c, len(next)+rapid.IntRange(0, 1).Draw(t, "gap"), "grown"))
			case 3: // shrunk
				if len(next) > 0 {
					next = next[:rapid.IntRange(0, len(next)-1).Draw(t, "left")]
				}
			case 4: // a repeat or two swapped
				if len(next) > 1 {
					i, j := rapid.IntRange(0, len(next)-1).Draw(t, "i"), rapid.IntRange(0, len(next)-1).Draw(t, "j")
					if rapid.Bool().Draw(t, "repeat") {
						next[i] = next[j]
					} else {
						next[i], next[j] = next[j], next[i]
					}
				}
			case 5: // an odd index
				if len(next) > 0 {
					next[rapid.IntRange(0, len(next)-1).Draw(t, "odd")].Index = -1
				}
			case 7: // a chunk's last worker repeating one of the next chunk
				if b := chunkLen * rapid.IntRange(1, 3).Draw(t, "boundary"); b+1 < len(next) {
					next[b-1] = next[b+1]
				}
			case 6: // a worker in a gap, where the next of prev's sits
				if len(next) > 0 {
					k := rapid.IntRange(0, len(next)-1).Draw(t, "gap")
					next[k].Index++
					if k+1 < len(ws) {
						next[k].NodeID, next[k].GPUs = ws[k+1].NodeID, ws[k+1].GPUs
					}
				}
			}
		}
		// Chunks equal to prev's at the same place are shared, as a
		// replan's store shares them.
		var chunks [][]plan.Worker
		pcs := prev.Workers.Chunks()
		for i := 0; i < len(next); i += chunkLen {
			ch := next[i:min(i+chunkLen, len(next))]
			if k := i / chunkLen; k < len(pcs) && slices.EqualFunc(ch, pcs[k], func(a, b plan.Worker) bool { return sameWorker(&a, &b) }) {
				ch = pcs[k]
			}
			chunks = append(chunks, ch)
		}
		n := &Plan{state: &runState{}}
		n.Workers = plan.FromChunks(chunks, len(next))
		// prev's order is found when CountMoved asks, or here, as a
		// run's finish finds next's from it where it is known.
		if rapid.Bool().Draw(t, "prevKnown") {
			// An empty list is not worth knowing.
			if _, ok := orderedOf(prev); ok != (fullInOrder(prev.Workers) && len(ws) > 0) {
				t.Fatalf("prev: known in order %v, a full walk %v", ok, fullInOrder(prev.Workers))
			}
		}
		if was := prev.state.ordered.Load(); was != nil && was.in {
			got, want := workersInOrder(n.Workers, was.ws), fullInOrder(n.Workers)
			if got != want {
				t.Fatalf("next: workersInOrder %v, a full walk %v", got, want)
			}
			n.state.ordered.Store(&orderProof{ws: n.Workers, in: got})
		}
		if got, want := CountMoved(prev, n), movedByIndex(prev, n); got != want {
			t.Fatalf("moved %d, want %d", got, want)
		}
	})
}
