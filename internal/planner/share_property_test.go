package planner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// shareWorld is a cluster and the jobs on it, as a sequence of changes
// leaves them; last holds each job's latest outcome.
type shareWorld struct {
	nodes []Node
	jobs  map[string]*Job
	last  map[string]*Plan
	age   uint64
}

func genShareSpec(t *rapid.T, name string) *Spec {
	s := genSpec(t)
	s.Priority = rapid.IntRange(0, 2).Draw(t, name+"Priority")
	if rapid.IntRange(0, 4).Draw(t, name+"Quota") == 0 {
		s.MaxGPUs = rapid.IntRange(1, 16).Draw(t, name+"MaxGPUs")
	}
	return s
}

// step changes the world at random and says what it changed: a job's
// name, or a node's id.
func (w *shareWorld) step(t *rapid.T) (job, node string) {
	switch rapid.IntRange(0, 5).Draw(t, "change") {
	case 0, 1: // a job arrives or changes
		name := fmt.Sprintf("j%d", rapid.IntRange(0, 4).Draw(t, "job"))
		if w.jobs[name] == nil {
			w.age++
			w.jobs[name] = &Job{Name: name, Age: w.age}
		}
		w.jobs[name].Spec = genShareSpec(t, name)
		return name, ""
	case 2: // a job leaves
		names := slices.Sorted(maps.Keys(w.jobs))
		if len(names) == 0 {
			return "", ""
		}
		name := rapid.SampledFrom(names).Draw(t, "gone")
		delete(w.jobs, name)
		delete(w.last, name)
		return name, ""
	case 3: // a node leaves
		if len(w.nodes) == 0 {
			return "", ""
		}
		i := rapid.IntRange(0, len(w.nodes)-1).Draw(t, "leaves")
		id := w.nodes[i].ID
		w.nodes = slices.Delete(slices.Clone(w.nodes), i, i+1)
		return "", id
	case 4: // a node joins
		w.age++
		id := fmt.Sprintf("m%d", w.age)
		w.nodes = append(slices.Clip(w.nodes), Node{ID: id, IP: "10.1.0.1", CPUs: 64, GPUs: rapid.SampledFrom([]int{1, 4, 8}).Draw(t, "joinGPUs")})
		return "", id
	default: // a GPU turns unhealthy
		if len(w.nodes) == 0 {
			return "", ""
		}
		i := rapid.IntRange(0, len(w.nodes)-1).Draw(t, "sickNode")
		if w.nodes[i].GPUs == 0 {
			return "", ""
		}
		w.nodes = slices.Clone(w.nodes)
		n := &w.nodes[i]
		n.Unhealthy = append(slices.Clip(n.Unhealthy), rapid.IntRange(0, n.GPUs-1).Draw(t, "sickGPU"))
		return "", n.ID
	}
}

// TestPlanAllProperties: over random clusters and random sequences of
// job and inventory changes, no GPU serves two jobs and no node's CPUs
// are given beyond its count; each plan that places workers (valid or
// degraded) holds the planner's invariants on its nodes and its quota,
// for the spec its placement follows; a job is not valid (invalid or
// degraded), or its new spec pending, only if that spec cannot be
// planned alone on what the jobs of higher or equal priority hold; and
// when a job changes (arrives, resizes, leaves), a job whose spec did not
// change, and above which no job of higher priority changed its
// placement, moves none of its workers (a degraded one may place its
// unplaced workers, or be placed whole afresh).
func TestPlanAllProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := &shareWorld{nodes: genNodes(t), jobs: map[string]*Job{}, last: map[string]*Plan{}}
		for range rapid.IntRange(1, 8).Draw(t, "steps") {
			changedJob, changedNode := w.step(t)
			names := slices.Sorted(maps.Keys(w.jobs))
			jobs := make([]Job, len(names))
			for i, n := range names {
				jobs[i] = *w.jobs[n]
				jobs[i].Prev = w.last[n]
			}
			out := PlanAll(jobs, w.nodes)
			checkShared(t, w.nodes, jobs, out)
			checkStable(t, jobs, out, changedJob, changedNode)
			for i, n := range names {
				w.last[n] = out[i].Plan
				w.jobs[n].Prev = out[i].Plan
			}
		}
	})
}

func checkShared(t *rapid.T, nodes []Node, jobs []Job, out []Outcome) {
	owner := map[string]string{}
	cpus := map[string]float64{}
	for j, o := range out {
		var degraded *DegradedError
		if o.Err == nil != o.Plan.Valid() || o.Plan.Valid() != (o.Plan.PlanState() == plan.StateValid) ||
			(o.Plan.PlanState() == plan.StateDegraded) != errors.As(o.Err, &degraded) {
			t.Fatalf("%s: error %v, valid %v, state %q", jobs[j].Name, o.Err, o.Plan.Valid(), o.Plan.PlanState())
		}
		if !o.Plan.Placed() {
			if o.Plan.Workers.Len() != 0 || o.Plan.PendingSpec != nil {
				t.Fatalf("%s: invalid with workers, or pending", jobs[j].Name)
			}
			continue
		}
		// The spec the placement follows: the job's, or while a new one
		// is pending, the one before.
		spec := o.Plan.spec
		if o.Plan.PendingSpec == nil && !specEqual(spec, jobs[j].Spec) {
			t.Fatalf("%s: placed on another spec than its own, not pending", jobs[j].Name)
		}
		if q := spec.MaxGPUs; q > 0 && HeldGPUs(o.Plan) > q {
			t.Fatalf("%s holds %d GPUs over its quota %d", jobs[j].Name, HeldGPUs(o.Plan), q)
		}
		if errs := checkPlan(spec, nodes, o.Plan); len(errs) > 0 {
			t.Fatalf("%s: %v", jobs[j].Name, errs)
		}
		EachHeldGPU(o.Plan, func(node string, g int) {
			k := fmt.Sprintf("%s:%d", node, g)
			if other, ok := owner[k]; ok && other != jobs[j].Name {
				t.Fatalf("GPU %s held by %s and %s", k, other, jobs[j].Name)
			}
			owner[k] = jobs[j].Name
		})
		for _, wk := range o.Plan.Workers.All() {
			cpus[wk.NodeID] += wk.CPUs
		}
	}
	for _, n := range nodes {
		if cpus[n.ID] > n.CPUs+1e-6 {
			t.Fatalf("node %s: %v CPUs given of %v", n.ID, cpus[n.ID], n.CPUs)
		}
	}
	// Not valid (or pending) only if it does not fit beside the higher
	// and equal jobs.
	a := newAllocator(jobs, nodes)
	for j, o := range out {
		if o.Plan.Valid() && o.Plan.PendingSpec == nil || jobs[j].Spec.MaxGPUs > 0 && HeldGPUs(o.Plan) > 0 {
			continue
		}
		var in []blocker
		for i := range jobs {
			if i != j && jobs[i].Spec.Priority >= jobs[j].Spec.Priority {
				in = append(in, blocker{jobs[i].Name, a.holdingOf(out[i].Plan)})
			}
		}
		alone, err := Compute(jobs[j].Spec, a.remainder(in, nil))
		if err == nil && (jobs[j].Spec.MaxGPUs == 0 || HeldGPUs(alone) <= jobs[j].Spec.MaxGPUs) {
			t.Fatalf("%s is %s (%s; pending %v) but fits alone on what higher or equal jobs leave", jobs[j].Name, o.Plan.PlanState(), o.Plan.Error, o.Plan.PendingSpec)
		}
	}
}

// checkStable: a job's workers stay where they are unless its spec
// changed or a job of higher priority changed its placement. Buffers
// aside: a buffer follows its train workers and takes up a GPU it could
// not have when one frees.
func checkStable(t *rapid.T, jobs []Job, out []Outcome, changedJob, changedNode string) {
	for j, o := range out {
		job := &jobs[j]
		// A job whose new spec was pending moves to it once it fits.
		if job.Prev == nil || !job.Prev.Placed() || job.Prev.PendingSpec != nil || job.Name == changedJob {
			continue
		}
		if changedNode != "" {
			// A node coming or going changes a plan's pools and its
			// capacity arithmetic even where the plan holds nothing
			// (as on a cluster of its own): only job changes are judged.
			return
		}
		disturbed := false
		for i := range jobs {
			hi := &jobs[i]
			if hi.Spec.Priority <= job.Spec.Priority {
				continue
			}
			if hi.Name == changedJob || hi.Prev == nil || hi.Prev.PlanState() != out[i].Plan.PlanState() ||
				hi.Prev.Placed() && !SamePlacement(hi.Prev, out[i].Plan) {
				disturbed = true
			}
		}
		// A job of higher priority that left is a change too.
		if changedJob != "" && !slices.ContainsFunc(jobs, func(x Job) bool { return x.Name == changedJob }) {
			disturbed = true
		}
		// A degraded job may place its unplaced workers, or be placed
		// whole afresh (fragmentation kept them out); it keeps the rest.
		afresh := !job.Prev.Valid() && o.Plan.Valid() && o.Change.Fresh
		if !disturbed && !afresh && (job.Prev.Valid() && !o.Plan.Valid() || !o.Plan.Placed() || !keptWorkers(job.Prev, o.Plan)) {
			for i := range jobs {
				t.Logf("%s prio %d age %d spec %+v %+v\n  prev %s\n  now  %s", jobs[i].Name, jobs[i].Spec.Priority, jobs[i].Age, *jobs[i].Spec.Scheduling.Eval, jobs[i].Spec.MaxGPUs, placementOf(jobs[i].Prev), placementOf(out[i].Plan))
			}
			t.Fatalf("%s moved (valid %v, %s) though nothing above it changed", job.Name, o.Plan.Valid(), o.Plan.Error)
		}
	}
}

func placementOf(p *Plan) string {
	if p == nil {
		return "none"
	}
	if !p.Placed() {
		return "invalid: " + p.Error
	}
	var b strings.Builder
	for _, w := range p.Workers.All() {
		fmt.Fprintf(&b, "%s%d@%s%v/%v ", w.Component, w.Index, w.NodeID, w.GPUs, w.CPUs)
	}
	return b.String()
}

// keptWorkers reports whether b places every train, eval and env worker
// of a where a has it (b may place more).
func keptWorkers(a, b *Plan) bool {
	for _, w := range a.Workers.All() {
		if w.Component == plan.Buffer {
			continue
		}
		if o := b.Workers.Find(w.Component, w.Index); o == nil || !samePlace(w, o) {
			return false
		}
	}
	return true
}

// sameWorkers reports whether b places every train, eval and env worker
// of a where a has it.
func sameWorkers(a, b *Plan) bool {
	if a.Valid() != b.Valid() || a.Workers.Len() != b.Workers.Len() {
		return false
	}
	for _, w := range a.Workers.All() {
		if w.Component == plan.Buffer {
			continue
		}
		if o := b.Workers.Find(w.Component, w.Index); o == nil || !samePlace(w, o) {
			return false
		}
	}
	return true
}
