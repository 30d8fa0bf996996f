package service

import (
	"time"

	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// DefaultGrowAfter is how long a GPU must have been free before an
// elastic group grows onto it.
const DefaultGrowAfter = 30 * time.Second

// growWatch is since when each GPU has been free (by node, per GPU; the
// zero time: held), as the last replan's plans left them, and when the
// next of the free GPUs becomes one that growth may take (wake; zero:
// none, or no elastic plan). The loop's goroutine alone changes it;
// note replaces since, never changes it, so a snapshot shares it.
type growWatch struct {
	since map[string][]time.Time
	wake  time.Time
}

// options is PlanAllWith's options at now: growth only onto GPUs free
// for after (note says since when: a GPU of a node not seen before from
// the replan that first sees it).
func (w *growWatch) options(now time.Time, after time.Duration) planner.ElasticOptions {
	if after < 0 {
		return planner.ElasticOptions{}
	}
	since := w.since
	return planner.ElasticOptions{GrowInto: func(node string, g int) bool {
		s := since[node]
		return g < len(s) && !s[g].IsZero() && !now.Before(s[g].Add(after))
	}}
}

// note records what the plans made this replan (outs; a plan not
// replanned, its Prev) hold, and when next a free GPU may be grown onto
// where some elastic plan is below its max.
func (w *growWatch) note(now time.Time, after time.Duration, jobs []planner.Job, outs []planner.Outcome, nodes []planner.Node) {
	elastic := false
	for i := range jobs {
		elastic = elastic || planner.IsElastic(jobs[i].Spec)
	}
	if !elastic {
		// Nothing grows: no cost to a cluster of fixed plans. Should an
		// elastic plan come, the GPUs free then are free from then.
		w.since, w.wake = nil, time.Time{}
		return
	}
	held := map[string][]bool{}
	mark := func(node string, g int) {
		b := held[node]
		if b == nil {
			b = make([]bool, 0, 8)
		}
		for len(b) <= g {
			b = append(b, false)
		}
		b[g] = true
		held[node] = b
	}
	wants := false
	for i := range jobs {
		p := jobs[i].Prev
		if i < len(outs) && outs[i].Plan != nil {
			p = outs[i].Plan
		}
		if p == nil || !p.Placed() {
			continue
		}
		planner.EachHeldGPU(p, mark)
		for _, u := range p.Unplaced {
			for _, g := range u.GPUs {
				if u.NodeID != "" && g >= 0 {
					mark(u.NodeID, g)
				}
			}
		}
		wants = wants || p.Valid() && belowMax(p)
	}
	next := make(map[string][]time.Time, len(nodes))
	w.wake = time.Time{}
	for _, n := range nodes {
		old, b := w.since[n.ID], held[n.ID]
		s := make([]time.Time, n.GPUs)
		for g := range s {
			if g < len(b) && b[g] {
				continue
			}
			s[g] = now
			if g < len(old) && !old[g].IsZero() {
				s[g] = old[g]
			}
			if at := s[g].Add(after); wants && after > 0 && at.After(now) && (w.wake.IsZero() || at.Before(w.wake)) {
				w.wake = at
			}
		}
		next[n.ID] = s
	}
	w.since = next
}

// belowMax reports whether an elastic group of p holds fewer workers
// than its max.
func belowMax(p *planner.Plan) bool {
	for _, d := range p.Demands {
		if d.Max > 0 && d.Workers < d.Max {
			return true
		}
	}
	return false
}

// elasticMetrics sets the gauges of p's elastic groups and, for a
// revision just published (counted), counts its resizes.
func elasticMetrics(m *metrics.Planner, p *planner.Plan, counted bool) {
	env := 0
	for _, d := range p.Demands {
		if d.Component == plan.Env {
			env++
		}
		if d.Max == 0 {
			continue
		}
		name := plan.Resize{Component: d.Component, Group: max(env-1, 0)}.Name()
		m.Elastic(p.Name, name, d.Workers)
	}
	if !counted {
		return
	}
	for _, r := range p.Status.Resized {
		m.Resized(p.Name, r.Name(), r.To > r.From)
	}
}

// armGrow sets the grow timer for the replan's wake (stopped when none).
func (l *loop) armGrow() {
	l.growT.Stop()
	if w := l.p.grow.wake; !w.IsZero() {
		l.growT.Reset(max(l.p.until(w), 0))
	}
}

// growDue is the grow timer firing: a change like any other, replanned
// through kick's gates (not during a resync, nor a failure's backoff,
// which its retry ends) and debounce.
func (l *loop) growDue() { l.kick() }
