package planner

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/poolplanner/poolplanner/plan"
)

// placeBuffers puts one buffer worker on every node that hosts train
// workers and maps it to them (storage_to_train_workers). Buffers are
// numbered in train order; a buffer whose node still hosts train keeps the
// index the previous plan gave it, so a launcher's buffer k stays where it
// was, and nodes new to train take the free indices. It returns the map
// and how many buffers changed node.
func (e *engine) placeBuffers() (map[string][]int, int) {
	if !e.hasBuffer || e.store == nil {
		return map[string][]int{}, 0
	}
	nodes := e.bufferIndex()
	b := len(nodes)
	e.store.resize(e.slots + b)
	moved := 0
	var s2t map[string][]int
	if e.fast {
		s2t = maps.Clone(e.prev.StorageToTrainWorkers)
		for k := range s2t {
			if i, err := strconv.Atoi(k); err != nil || i >= b || nodes[i] < 0 {
				delete(s2t, k)
			}
		}
	} else {
		s2t = make(map[string][]int, b)
	}
	prevB := 0
	if e.fast {
		prevB = e.prev.Workers.Len() - e.prevSlots
	}
	// From the document, the previous buffers by index, read once: a
	// Find per buffer reads every worker for each one the previous plan
	// lacked (a buffer added, train spread onto new nodes).
	var prevBuf []*plan.Worker
	if !e.fast && e.prev != nil {
		for _, w := range e.prev.Workers.All() {
			if w.Component == plan.Buffer && w.Index >= 0 && w.Index < b {
				for len(prevBuf) <= w.Index {
					prevBuf = append(prevBuf, nil)
				}
				prevBuf[w.Index] = w
			}
		}
	}
	hosts := 0
	for k, at := range nodes {
		if at < 0 {
			e.unseatBuffer(k)
			continue
		}
		hosts++
		same := k < len(e.prevBuffers) && e.prevBuffers[k] == at
		if same && e.fast && e.table[at].owner != e.token {
			continue // neither the node nor its buffer changed
		}
		w := e.bufferWorker(k, at)
		if k >= prevB || !samePlace(e.prev.Workers.At(e.prevSlots+k), &w) {
			moved++
		}
		// A buffer that stays on its node but takes other GPUs (its
		// reserved GPU failed, or was on a node that left) is re-placed
		// all the same, whether the run started from the plan's state or
		// from its document: the change says so either way.
		var was *plan.Worker
		switch {
		case e.fast && k < prevB:
			was = e.prev.Workers.At(e.prevSlots + k)
		case k < len(prevBuf):
			was = prevBuf[k]
		}
		if e.prev != nil && (!same || was != nil && !samePlace(was, &w)) {
			from := ""
			if k < len(e.prevBufferIDs) {
				from = e.prevBufferIDs[k]
			} else if k < prevB {
				from = e.prev.Workers.At(e.prevSlots + k).NodeID
			}
			e.displaced = append(e.displaced, Displaced{Component: plan.Buffer, Index: k, NodeID: from, Why: WhyBuffer})
		}
		e.store.set(e.slots+k, w)
		e.rebuffered = append(e.rebuffered, at)
		s2t[strconv.Itoa(k)] = e.trainOn(e.table[at])
	}
	bf := e.spec.Scheduling.Buffer
	if !bf.Auto && bf.WorkerNum != hosts {
		e.warnings = append(e.warnings, fmt.Sprintf(
			"scheduling.buffer.worker_num %d overridden: one buffer worker per node hosting train workers, %d in all",
			bf.WorkerNum, hosts))
	}
	e.buffers = nodes
	return s2t, moved
}

// unseatBuffer leaves buffer k of a degraded plan unplaced: the train
// workers it served are unplaced (their node left, or cannot hold them
// now); it keeps its index, so that it goes back with them and no other
// buffer moves meanwhile.
func (e *engine) unseatBuffer(k int) {
	from := ""
	if k < len(e.prevBufferIDs) {
		from = e.prevBufferIDs[k]
	}
	if from == "" && e.prev != nil {
		if w := e.prev.Workers.Find(plan.Buffer, k); w != nil {
			from = w.NodeID
		}
	}
	why, where := WhyBuffer, ""
	if k < len(e.prevBuffers) && e.prevBuffers[k] < 0 {
		why, where = WhyNodeLeft, from
	}
	d := Displaced{Component: plan.Buffer, Index: k, NodeID: from, Why: why, Where: where}
	e.displaced = append(e.displaced, d)
	e.unseated[e.slots+k] = d
}

// degradedRun reports whether the run is making a degraded plan: it may
// (degrade), and workers it had to place again are left without a place.
func (e *engine) degradedRun() bool { return e.degrade && len(e.unseated) > 0 }

// bufferIndex numbers the nodes hosting train: kept indices first, then
// the nodes that need one, by their first train worker, in the lowest
// free indices. It returns the node of each index. A valid plan numbers
// its buffers densely, so an index past the count moves to a free one;
// a degraded plan keeps every buffer whose node still hosts train at its
// index and leaves those of nodes that left unplaced (-1) where no node
// new to train takes them: a node that blinks moves no other buffer, and
// its own returns to it.
func (e *engine) bufferIndex() []int32 {
	hosts := make(map[int32]bool, len(e.prevBuffers)+len(e.trainNodes))
	for _, at := range e.prevBuffers {
		if at >= 0 && e.table[at].count[compTrain] > 0 {
			hosts[at] = true
		}
	}
	for _, at := range e.trainNodes {
		if e.table[at].count[compTrain] > 0 {
			hosts[at] = true
		}
	}
	b := len(hosts)
	degraded := e.degradedRun()
	if degraded {
		b = max(b, len(e.prevBuffers))
	}
	nodes := make([]int32, b)
	taken := make([]bool, b)
	index := make(map[int32]int, b)
	for k, at := range e.prevBuffers {
		if k < b && at >= 0 && hosts[at] {
			if _, dup := index[at]; !dup {
				index[at], nodes[k], taken[k] = k, at, true
			}
		}
	}
	var need []int32
	for at := range hosts {
		if _, ok := index[at]; !ok {
			need = append(need, at)
		}
	}
	slices.SortFunc(need, func(a, b int32) int { return cmp.Compare(e.table[a].firstTrain, e.table[b].firstTrain) })
	next := 0
	for _, at := range need {
		for taken[next] {
			next++
		}
		index[at], nodes[next], taken[next] = next, at, true
	}
	for k := range nodes {
		if !taken[k] {
			nodes[k] = -1 // degraded: unplaced with its train workers
		}
	}
	return nodes
}

// bufferWorker is buffer k on node at. A buffer that uses CUDA gets the
// GPUs reserved for it in its node's train range: those no train worker
// holds.
func (e *engine) bufferWorker(k int, at int32) plan.Worker {
	ns := e.table[at]
	bf := e.spec.Scheduling.Buffer
	first := e.store.at(e.base[compTrain] + int(ns.firstTrain))
	w := plan.Worker{Component: plan.Buffer, Index: k, Pool: first.Pool, NodeID: ns.node.ID, IP: ns.node.IP, CPUs: bf.NumCPUs}
	if bf.NumGPUs <= 0 {
		return w
	}
	var spare []int
	if e.rules.manual {
		if _, en := e.entryOf(first.Pool, at); en != nil {
			for _, g := range en.alloc[0] {
				if g < ns.node.GPUs && ns.shareOf(compTrain)[g] <= eps {
					spare = append(spare, g)
				}
			}
		}
	} else {
		spare = ns.reserved()
	}
	want := max(1, int(math.Ceil(bf.NumGPUs-eps)))
	for _, g := range spare[:min(want, len(spare))] {
		w.GPUs = append(w.GPUs, g)
		if ns.node.hasUUIDs() {
			w.GPUUUIDs = append(w.GPUUUIDs, ns.node.GPUUUIDs[g])
		}
	}
	if len(w.GPUs) > 0 {
		w.GPUShare = min(bf.NumGPUs, 1)
	}
	return w
}

// trainOn lists the train workers on ns, ascending.
func (e *engine) trainOn(ns *nodeState) []int {
	lo, hi := int32(e.base[compTrain]), int32(e.base[compTrain]+e.demands[compTrain].asked)
	var out []int
	for _, r := range ns.slots() {
		for s := max(r.first, lo); s < min(r.first+r.n, hi); s++ {
			out = append(out, int(s-lo))
		}
	}
	slices.Sort(out)
	return out
}
