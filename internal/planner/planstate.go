package planner

import "github.com/poolplanner/poolplanner/plan"

// Plan is a plan document and what the run that made it keeps for the
// next incremental run.
type Plan struct {
	plan.Document
	// state is nil for a plan read back from JSON, and for a degraded
	// plan (its workers are not its run's slots).
	state *runState
	// spec is the spec the run that made the plan placed (nil: read back
	// from JSON): a degraded plan's, or a kept placement's whose new spec
	// is pending, is what the next run re-checks it against.
	spec *Spec
	// A degraded plan's cause is why its spec cannot be placed whole,
	// before Error words it as degraded; afresh is the plan made afresh
	// on the same room, which failed: what it is released as when a plan
	// of higher priority takes its GPUs; takenBy names the plans holding
	// GPUs of the workers its run could not keep (WhyPreempted).
	cause   string
	afresh  *Outcome
	takenBy []string
	// releasedAs, where set, is what a degraded plan is released as in
	// afresh's place: the plan made afresh with every plan of lower
	// priority given way (place), as the next run plans a job that holds
	// nothing, so that its words do not change on a quiet cluster.
	releasedAs *Outcome
	// notesFrom, for a plan without a state cut from every worker of one
	// that had one (truncated), is that state's nodes the cut took no
	// worker from: what the next run keeps notes from, as from the state
	// cutFast would have made (engine.keepNotes).
	notesFrom []*nodeState
}

// WithRunOf is p's document with what the run that made next keeps for
// the next run (its state, the spec it placed, a degraded plan's
// causes): next places everything as p does (SamePlacement), so the
// service keeps p, the revision published, rather than publish next.
// Where next was made for a new spec, the next run must start from that
// spec, as one restarted on p's document does (its demands are the new
// spec's); from p's own run it would take the spec to have changed
// still, and keep the placement on the old one, the new spec pending.
func (p *Plan) WithRunOf(next *Plan) *Plan {
	out := *p
	out.state, out.spec, out.cause, out.afresh, out.takenBy, out.releasedAs = next.state, next.spec, next.cause, next.afresh, next.takenBy, next.releasedAs
	return &out
}
