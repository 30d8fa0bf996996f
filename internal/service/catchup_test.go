package service

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// TestCatchUpComparesRevision: catchUp skips reading again only the
// revision it holds, by stream sequence and revision: a plan stream made
// again since the planner's load, whose last event landed on the same
// sequence with another revision, is read and adopted, not taken for
// what was read.
func TestCatchUpComparesRevision(t *testing.T) {
	ctx := context.Background()
	m := newMemJS(systemClock{})
	p := New(Config{Log: zerolog.Nop()})
	m.onMem(p)
	ps := p.plans
	if err := ps.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	s1, err := ps.PublishEvent(ctx, wholeEvent("p", 1), "d", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := ps.PublishEvent(ctx, wholeEvent("p", 3), "d", s1, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := drive(p)
	for _, c := range []struct {
		name    string
		heldRev int
		wantRev int
	}{
		{"the revision held", 3, 3},
		{"another revision at the same sequence", 1, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := l.addState("p")
			held := &store.StoredPlan{Plan: &planner.Plan{Document: plan.Document{Header: plan.Header{Name: "p", Revision: c.heldRev}}}}
			held.Seq = s2
			s.latest = held
			if err := l.catchUp(ctx, s); err != nil {
				t.Fatal(err)
			}
			if got := s.latest.Plan.Revision; got != c.wantRev {
				t.Errorf("after catchUp: revision %d, want %d", got, c.wantRev)
			}
			if c.heldRev == c.wantRev && s.latest != held {
				t.Errorf("the revision held was read again")
			}
		})
	}
}
