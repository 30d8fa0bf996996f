package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestStatusSaysWhy: each plan's typed status says what its error says
// in words: valid; waiting for room the plans named hold; preempted by
// the plans named; over its quota; and, for a fresh placement, why.
func TestStatusSaysWhy(t *testing.T) {
	nodes := shareNodes(4) // 32 GPUs
	a := Job{Name: "a", Spec: trainSpec(t, 12, 0, 0), Age: 1}
	b := Job{Name: "b", Spec: trainSpec(t, 12, 0, 0), Age: 2}
	out := planAll(t, []Job{a, b}, nodes)
	if st := out["a"].Plan.Status; st.State != plan.StateValid || st.Reason != "" {
		t.Errorf("a: %+v", st)
	}
	if out["a"].Change.FreshKind != plan.FreshFirst {
		t.Errorf("a's first placement: fresh %q", out["a"].Change.FreshKind)
	}

	// big (priority 10) takes b's room: b is preempted by big.
	a.Prev, b.Prev = out["a"].Plan, out["b"].Plan
	b.Spec = trainSpec(t, 12, -1, 0)
	big := Job{Name: "big", Spec: trainSpec(t, 16, 10, 0), Age: 3}
	out = planAll(t, []Job{a, b, big}, nodes)
	st := out["b"].Plan.Status
	if st.State != plan.StateInvalid || st.Reason != plan.ReasonPreempted || !slices.Equal(st.By, []string{"big"}) ||
		!strings.HasSuffix(out["b"].Plan.Error, st.Cause) || st.Cause == "" {
		t.Errorf("b: %+v (error %q)", st, out["b"].Plan.Error)
	}

	// Of one priority, a newcomer that does not fit waits for the room
	// the older plan holds.
	two := shareNodes(2)
	old := Job{Name: "old", Spec: trainSpec(t, 12, 3, 0), Age: 1}
	old.Prev = planAll(t, []Job{old}, two)["old"].Plan
	newer := Job{Name: "newer", Spec: trainSpec(t, 8, 3, 0), Age: 2}
	out = planAll(t, []Job{newer, old}, two)
	if st := out["newer"].Plan.Status; st.Reason != plan.ReasonWaiting || !slices.Equal(st.By, []string{"old"}) ||
		!strings.HasPrefix(st.Cause, "Insufficient GPUs") {
		t.Errorf("newer: %+v (error %q)", st, out["newer"].Plan.Error)
	}

	// Over its max_gpus: quota, never put down to others.
	q := Job{Name: "q", Spec: trainSpec(t, 12, 0, 8), Age: 1}
	if st := planAll(t, []Job{q}, nodes)["q"].Plan.Status; st.Reason != plan.ReasonQuota || len(st.By) > 0 {
		t.Errorf("q: %+v", st)
	}
}
