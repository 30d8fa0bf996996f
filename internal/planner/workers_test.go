package planner

import (
	"fmt"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestStoreOver: a store over a previous plan's workers shares each of
// its chunks until a slot is set to a different worker, and reads every
// slot the run did not set as empty once cleared, as a fresh store
// would; the previous plan's workers are never written.
func TestStoreOver(t *testing.T) {
	worker := func(i int, node string) plan.Worker {
		return plan.Worker{Component: plan.Eval, Index: i, Pool: "p", NodeID: node, GPUs: []int{i % 8}, GPUUUIDs: []string{fmt.Sprint("GPU-", i)}, GPUShare: 1, CPUs: 1}
	}
	const prevLen = 3*chunkLen + 7
	for _, c := range []struct {
		name string
		n    int
		// set is what the run sets: slot -> node ("" leaves it unset).
		set        func(i int) string
		wantShared []bool // per chunk, after the run
	}{
		{"all the same", prevLen, func(int) string { return "n" }, []bool{true, true, true, true}},
		{"one moved", prevLen, func(i int) string {
			if i == chunkLen+3 {
				return "m"
			}
			return "n"
		}, []bool{true, false, true, true}},
		{"one unset", prevLen, func(i int) string {
			if i == 2*chunkLen {
				return ""
			}
			return "n"
		}, []bool{true, true, false, true}},
		{"fewer slots", 2*chunkLen + 1, func(int) string { return "n" }, []bool{true, true, false}},
		{"more slots", prevLen + chunkLen, func(int) string { return "n" }, []bool{true, true, true, false, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			prevSlice := make([]plan.Worker, prevLen)
			for i := range prevSlice {
				prevSlice[i] = worker(i, "n")
			}
			prev := plan.NewWorkers(prevSlice)
			s := storeOver(prev, c.n)
			for i := range c.n {
				if node := c.set(i); node != "" {
					s.set(i, worker(i, node))
				}
			}
			s.clearUnset()
			got := s.workers()
			if got.Len() != c.n {
				t.Fatalf("%d workers, want %d", got.Len(), c.n)
			}
			for i := range c.n {
				w, node := got.At(i), c.set(i)
				switch {
				case node == "" && !isEmpty(w):
					t.Errorf("slot %d unset: %+v, want empty", i, *w)
				case node != "":
					want := worker(i, node)
					if !sameWorker(w, &want) {
						t.Errorf("slot %d: %+v, want %+v", i, *w, want)
					}
				}
			}
			for i := range prevLen {
				want := worker(i, "n")
				if !sameWorker(prev.At(i), &want) {
					t.Fatalf("the previous plan's slot %d written: %+v", i, *prev.At(i))
				}
			}
			pcs := prev.Chunks()
			for k, ch := range got.Chunks() {
				shared := k < len(pcs) && len(ch) > 0 && len(pcs[k]) == len(ch) && &ch[0] == &pcs[k][0]
				if shared != c.wantShared[k] {
					t.Errorf("chunk %d shared %v, want %v", k, shared, c.wantShared[k])
				}
			}
		})
	}
}

// TestStoreOverResized: a store over a previous plan's workers that
// grows before its unset slots are cleared (buffers after the workers)
// takes writes past its first length, and clears only what it shared.
func TestStoreOverResized(t *testing.T) {
	prevSlice := make([]plan.Worker, chunkLen+5)
	for i := range prevSlice {
		prevSlice[i] = plan.Worker{Component: plan.Eval, Index: i, NodeID: "n"}
	}
	s := storeOver(plan.NewWorkers(prevSlice), chunkLen+5)
	s.resize(3*chunkLen + 1)
	last := plan.Worker{Component: plan.Buffer, Index: 0, NodeID: "m"}
	s.set(3*chunkLen, last)
	s.set(0, prevSlice[0])
	s.clearUnset()
	got := s.workers()
	if w := got.At(3 * chunkLen); !sameWorker(w, &last) {
		t.Errorf("the slot set past the first length: %+v", *w)
	}
	if w := got.At(0); !sameWorker(w, &prevSlice[0]) {
		t.Errorf("slot 0: %+v", *w)
	}
	for _, i := range []int{1, chunkLen + 4, chunkLen + 5, 3*chunkLen - 1} {
		if w := got.At(i); !isEmpty(w) {
			t.Errorf("unset slot %d: %+v, want empty", i, *w)
		}
	}
}
