package planner

import "math"

// demand walks one component's workers in index order; env groups follow
// one another.
type demand struct {
	comp   Component
	ci     int // index into gpuComponents
	groups []WorkerGroup
	gi     int // current group
	inG    int // workers of the current group already placed
	index  int // next worker index
	total  int
}

func newDemand(ci int, groups []WorkerGroup) *demand {
	d := &demand{comp: gpuComponents[ci], ci: ci}
	for _, g := range groups {
		if g.WorkerNum > 0 {
			d.groups = append(d.groups, g)
			d.total += g.WorkerNum
		}
	}
	return d
}

func (d *demand) done() bool { return d.index >= d.total }

func (d *demand) cur() WorkerGroup { return d.groups[d.gi] }

func (d *demand) advance() {
	d.index++
	d.inG++
	if d.inG >= d.groups[d.gi].WorkerNum {
		d.gi++
		d.inG = 0
	}
}

// gpusNeeded is how many GPUs the component's workers fill when packed in
// order onto fresh GPUs: whole GPUs for multi-GPU workers, next-fit for
// fractions. rlightning truncates fractional totals instead (int(1.5) == 1)
// and leaves workers unplaced; this counts what the packing really needs.
func gpusNeeded(groups []WorkerGroup) int {
	n := 0
	room := 0.0 // capacity left on the current, partly filled GPU
	for _, g := range groups {
		w := g.WorkerNum
		switch {
		case w <= 0 || g.NumGPUs <= 0:
		case g.NumGPUs > 1:
			n += w * int(math.Round(g.NumGPUs))
			room = 0
		default:
			// Next-fit in closed form (a spec may ask for millions of
			// workers): fill what the current GPU has room for, then
			// whole GPUs of per workers each.
			per := int((1 + eps) / g.NumGPUs)
			first := min(w, int((room+eps)/g.NumGPUs))
			room -= float64(first) * g.NumGPUs
			if rest := w - first; rest > 0 {
				full := (rest + per - 1) / per
				n += full
				room = 1 - float64(rest-(full-1)*per)*g.NumGPUs
			}
		}
	}
	return n
}

// stopReason says why a component stopped filling a node.
type stopReason int

const (
	stopDone stopReason = iota
	stopGPUs
	stopCPUs
	stopTooSmall
)

// packer places workers onto nodes and records them.
type packer struct {
	bufferCPUs float64 // reserved with a node's first train worker
	hasBuffer  bool
	// workers holds train, eval and env workers at base[component]+index,
	// so the document needs no sorting; slots stay empty until placed.
	workers []Worker
	base    [len(gpuComponents)]int
	placed  int
	// poolsOnly counts placements without recording workers.
	poolsOnly bool
	uuidSlab  []string
	notes     *notes
}

// fill places the component's next workers onto the GPUs gpus of node ns,
// in order, for pool. A GPU takes fractional workers while they fit its
// capacity; a worker needing k > 1 GPUs takes k GPUs of this node no other
// worker of its component touches. It returns how many GPUs from the start
// of gpus it touched and why it stopped.
func (p *packer) fill(pool string, ns *nodeState, d *demand, gpus []int) (int, stopReason) {
	if d.done() {
		return 0, stopDone
	}
	share := ns.shares(d.ci)
	pos, touched, placed := 0, 0, 0
	// A node that filled up is no news; one that took nothing is.
	passedOver := func(reason string) {
		if placed == 0 && len(gpus) > 0 {
			p.notes.add(ns.node.ID, d.comp, reason)
		}
	}
	for !d.done() {
		g := d.cur()
		cpus := g.NumCPUs
		if d.comp == Train && !ns.hasTrain && p.hasBuffer {
			cpus += p.bufferCPUs
		}
		if cpus > ns.cpuLeft+eps {
			p.notes.add(ns.node.ID, d.comp, ReasonCPUsExhausted)
			return touched, stopCPUs
		}
		var held []int
		frac := 1.0
		switch {
		case g.NumGPUs <= 0:
		case g.NumGPUs <= 1:
			for pos < len(gpus) && share[gpus[pos]]+g.NumGPUs > 1+eps {
				pos++
			}
			if pos >= len(gpus) {
				passedOver(ReasonNoFreeGPUs)
				return touched, stopGPUs
			}
			held = gpus[pos : pos+1]
			frac = g.NumGPUs
			touched = max(touched, pos+1)
			// The rest of the group that fits on this GPU, and in the
			// node's CPUs, goes at once: a 0.25 env group of 300,000
			// workers is then 75,000 steps, not 300,000.
			n := min(g.WorkerNum-d.inG, int((1+eps-share[gpus[pos]])/g.NumGPUs))
			if cpus > 0 {
				n = min(n, int((ns.cpuLeft+eps)/cpus))
			}
			if d.comp == Train && !ns.hasTrain && p.hasBuffer {
				n = 1 // the first train worker also reserves its buffer's CPUs
			}
			n = max(n, 1)
			for range n - 1 {
				share[gpus[pos]] += g.NumGPUs
				ns.cpuLeft -= cpus
				ns.hasTrain = ns.hasTrain || d.comp == Train
				p.place(d.comp, d.index, pool, ns.node, held, frac, g.NumCPUs)
				placed++
				d.advance()
			}
			share[gpus[pos]] += g.NumGPUs
		default:
			k := int(math.Round(g.NumGPUs))
			for pos < len(gpus) && share[gpus[pos]] > eps {
				pos++
			}
			if pos+k > len(gpus) {
				if len(ns.usable) < k {
					passedOver(ReasonTooSmall)
					return touched, stopTooSmall
				}
				passedOver(ReasonNoFreeGPUs)
				return touched, stopGPUs
			}
			for _, x := range gpus[pos : pos+k] {
				if share[x] > eps {
					passedOver(ReasonNoFreeGPUs)
					return touched, stopGPUs
				}
			}
			for _, x := range gpus[pos : pos+k] {
				share[x] = 1
			}
			held = gpus[pos : pos+k]
			pos += k
			touched = max(touched, pos)
		}
		ns.cpuLeft -= cpus
		if d.comp == Train {
			ns.hasTrain = true
		}
		p.place(d.comp, d.index, pool, ns.node, held, frac, g.NumCPUs)
		placed++
		d.advance()
	}
	return touched, stopDone
}

// reserve sizes the worker slab for the demands up front: at ten
// thousand nodes growing it costs more than the planning.
func (p *packer) reserve(ds [len(gpuComponents)]*demand, extra int) {
	if p.poolsOnly {
		return
	}
	total := 0
	for ci, d := range ds {
		p.base[ci] = total
		total += d.total
	}
	p.workers = make([]Worker, total, total+extra)
}

func (p *packer) place(c Component, index int, pool string, n *Node, gpus []int, frac, cpus float64) {
	if p.poolsOnly {
		p.placed++
		return
	}
	if p.poolsOnly {
		p.placed++
		return
	}
	w := Worker{Component: c, Index: index, Pool: pool, NodeID: n.ID, IP: n.IP, GPUShare: frac, CPUs: cpus}
	if len(gpus) > 0 {
		// gpus is a window on a list no one changes after it is made (a
		// node's healthy GPUs, or a manual pool's), so workers share it
		// rather than copy it: plans are read-only.
		w.GPUs = gpus[:len(gpus):len(gpus)]
		if len(n.GPUUUIDs) == n.GPUs {
			ustart := len(p.uuidSlab)
			for _, x := range gpus {
				p.uuidSlab = append(p.uuidSlab, n.GPUUUIDs[x])
			}
			w.GPUUUIDs = p.uuidSlab[ustart:len(p.uuidSlab):len(p.uuidSlab)]
		}
	} else {
		w.GPUShare = 0
	}
	p.workers[p.base[c.Rank()]+index] = w
	p.placed++
}
