package service

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// TestKeptPlacement: a plan's latest revision kept beside the marks
// reads back whole for its revision only; one too large to keep removes
// the file, so an older placement is never taken for it; a damaged file
// is an error; without a state file nothing is kept.
func TestKeptPlacement(t *testing.T) {
	stored := func(rev, workers int) *store.StoredPlan {
		doc := plan.Document{Header: plan.Header{Name: "p", Revision: rev, Status: plan.Status{State: plan.StateValid}}}
		ws := make([]plan.Worker, workers)
		for i := range ws {
			ws[i] = plan.Worker{Component: plan.Train, Index: i, NodeID: "n1", GPUs: []int{i % 8}, GPUUUIDs: []string{"GPU-x"}}
		}
		doc.Workers = plan.NewWorkers(ws)
		return &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{SpecDigest: "d1"}}
	}
	k := newMarks(filepath.Join(t.TempDir(), "revisions.json"))
	if err := k.keep("p", stored(3, 4)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rev     int
		workers int // -1: none read back
	}{{3, 4}, {2, -1}, {4, -1}} {
		got, err := k.kept("p", c.rev)
		switch {
		case err != nil:
			t.Fatalf("revision %d: %v", c.rev, err)
		case c.workers < 0 && got != nil:
			t.Errorf("revision %d read back as kept", c.rev)
		case c.workers >= 0 && (got == nil || got.Plan.Workers.Len() != c.workers || got.SpecDigest != "d1" || !planner.SamePlacement(got.Plan, stored(3, 4).Plan)):
			t.Errorf("revision %d: %+v", c.rev, got)
		}
	}
	if err := k.keep("p", stored(5, maxKeptWorkers+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(k.placementPath("p")); !os.IsNotExist(err) {
		t.Errorf("a plan too large to keep left a file: %v", err)
	}
	if err := os.WriteFile(k.placementPath("q"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := k.kept("q", 1); err == nil {
		t.Error("a damaged kept plan read")
	}
	none := newMarks("")
	if err := none.keep("p", stored(1, 1)); err != nil {
		t.Fatal(err)
	}
	if got, err := none.kept("p", 1); got != nil || err != nil {
		t.Errorf("without a state file: %v, %v", got, err)
	}
}
