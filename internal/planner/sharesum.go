package planner

import "github.com/poolplanner/poolplanner/plan"

// HeldSharesFrom is HeldShares(next) given prevShares, HeldShares(prev).
// Where next was made from prev's state (Diff's fast case) only the
// nodes the run touched are read again, in both plans: a node leaving a
// 405,000-worker plan costs its workers, not a pass over all of them.
// Otherwise it sums next whole. prev may be nil.
func HeldSharesFrom(prev, next *Plan, prevShares float64) float64 {
	if prev == nil || prev.state == nil || next.state == nil || next.state.from != prev.state.token || next.state.spec.isManual() {
		return HeldShares(next)
	}
	was, now := prev.state.nodeContent(prev), next.state.nodeContent(next)
	held := prevShares
	for _, id := range next.state.changedIDs() {
		held += sharesOf(now(id).Workers) - sharesOf(was(id).Workers)
	}
	return held
}

func sharesOf(ws []plan.Worker) float64 {
	held := 0.0
	for i := range ws {
		held += ws[i].GPUShare * float64(len(ws[i].GPUs))
	}
	return held
}
