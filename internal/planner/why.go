package planner

// metric is a run's record of why, as Nomad's AllocMetric: every node a
// component passed over and the reason, and what binds a plan that
// failed. The plan's explanations and notes, the text's "why" and the
// error messages are rendered from it (explain.go, capacity.go). Reasons
// are the Reason constants, the Why constants of displaced workers, or a
// constraint's own.
//
// A node is passed over in one of two ways. filter: for a reason of its
// own (labels, models, too few GPUs, CPUs spent, a compromise), kept with
// the node: its notes go with its state into the next plan, which so
// keeps the reasons of the nodes it does not touch. exhaust: simply full,
// which is news only in sum, counted for this run alone.
type metric struct {
	exhausted [nComp]map[string]*tally
	// bound is what keeps a failed constrained plan from every worker
	// (binding.go).
	bound *binding
}

// filter records that component c passed over node ns (a state this run
// may write) for reason.
func (e *engine) filter(ns *nodeState, c comp, reason string) {
	ns.note(c.Component(), reason, &e.extras)
}

// filterAt is filter for the node at position at, copied first when a
// previous plan owns it; a node that says so already is not copied, so
// that a replan touches none of the nodes a group may not use.
func (e *engine) filterAt(at int32, c comp, reason string) {
	if ns := e.table[at]; !ns.noted(c.Component(), reason) {
		e.filter(e.mut(at), c, reason)
	}
}

// exhaust records that component c passed by node id, full, for reason
// ("" id: a reason that concerns no node).
func (e *engine) exhaust(c comp, reason, id string) {
	if e.why.exhausted[c] == nil {
		e.why.exhausted[c] = map[string]*tally{}
	}
	t := e.why.exhausted[c][reason]
	if t == nil {
		t = &tally{}
		e.why.exhausted[c][reason] = t
	}
	t.add(id)
}
