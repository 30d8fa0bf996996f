package service

import (
	"os"
	"path/filepath"
	"testing"

	"pgregory.net/rapid"

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
		got, found, err := k.kept("p", c.rev)
		switch {
		case err != nil:
			t.Fatalf("revision %d: %v", c.rev, err)
		case found != 3:
			t.Errorf("revision %d: found revision %d kept, want 3", c.rev, found)
		case c.workers < 0 && got != nil:
			t.Errorf("revision %d read back as kept", c.rev)
		case c.workers >= 0 && (got == nil || got.Plan.Workers.Len() != c.workers || got.SpecDigest != "d1" || !planner.SamePlacement(got.Plan, stored(3, 4).Plan)):
			t.Errorf("revision %d: %+v", c.rev, got)
		}
	}
	k.maxWorkers = 10 // maxKeptWorkers, but for a plan a test can build
	if err := k.keep("p", stored(5, 11)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(k.placementPath("p")); !os.IsNotExist(err) {
		t.Errorf("a plan too large to keep left a file: %v", err)
	}
	if err := os.WriteFile(k.placementPath("q"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.kept("q", 1); err == nil {
		t.Error("a damaged kept plan read")
	}
	// A file from before planners kept the spec revision reads still,
	// the revision not known.
	old := stored(1, 2)
	old.Plan.Name = "r"
	if err := os.WriteFile(k.placementPath("r"), append(append([]byte(`{"spec_digest":"d1","document":`), old.Plan.AppendJSON(nil)...), '}'), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _, err := k.kept("r", 1); err != nil || got == nil || got.SpecDigest != "d1" || got.SpecRevision != 0 || got.Plan.Workers.Len() != 2 {
		t.Errorf("a file without the spec revision: %+v, %v", got, err)
	}
	none := newMarks("")
	if err := none.keep("p", stored(1, 1)); err != nil {
		t.Fatal(err)
	}
	if got, _, err := none.kept("p", 1); got != nil || err != nil {
		t.Errorf("without a state file: %v, %v", got, err)
	}
}

// TestKeptPlacementRoundTrip: whatever a plan holds (odd strings in its
// reason and workers, shares, any number of workers), the kept file
// reads back as the very document, digests and spec revision kept.
func TestKeptPlacementRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rapid.Check(t, func(rt *rapid.T) {
		odd := rapid.StringMatching(`[a-z0-9 "\\\x00-\x1f<>&\x{2028}é]{0,12}`)
		doc := plan.Document{Header: plan.Header{Name: "p", Revision: rapid.IntRange(1, 1<<30).Draw(rt, "revision"),
			Status: plan.Status{State: rapid.SampledFrom([]plan.State{plan.StateValid, plan.StateDegraded, plan.StateInvalid}).Draw(rt, "state")}, Reason: odd.Draw(rt, "reason")}}
		n := rapid.IntRange(0, 40).Draw(rt, "workers")
		ws := make([]plan.Worker, n)
		for i := range ws {
			ws[i] = plan.Worker{Component: rapid.SampledFrom([]plan.Component{plan.Train, plan.Eval, plan.Env, plan.Buffer}).Draw(rt, "component"),
				Index: i, Pool: odd.Draw(rt, "pool"), NodeID: odd.Draw(rt, "node"), IP: "10.0.0.1",
				GPUs: rapid.SliceOfN(rapid.IntRange(0, 7), 0, 4).Draw(rt, "gpus"), GPUUUIDs: rapid.SliceOfN(odd, 0, 4).Draw(rt, "uuids"),
				GPUShare: rapid.Float64Range(0, 1).Draw(rt, "share"), CPUs: rapid.Float64Range(0, 64).Draw(rt, "cpus")}
		}
		doc.Workers = plan.NewWorkers(ws)
		digest := odd.Draw(rt, "digest")
		meta := client.Meta{SpecDigest: digest, PlacedFor: rapid.SampledFrom([]string{"", "d0"}).Draw(rt, "placed for"),
			SpecRevision: rapid.SampledFrom([]uint64{0, 1, 1<<64 - 1}).Draw(rt, "spec revision")}
		k := newMarks(filepath.Join(dir, "revisions.json"))
		if err := k.keep("p", &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: meta}); err != nil {
			rt.Fatal(err)
		}
		got, _, err := k.kept("p", doc.Revision)
		if err != nil || got == nil {
			rt.Fatalf("read back: %v, %v", got, err)
		}
		if a, b := string(got.Plan.Document.AppendJSON(nil)), string(doc.AppendJSON(nil)); a != b || got.SpecDigest != digest ||
			got.PlacedFor != meta.PlacedFor || got.SpecRevision != meta.SpecRevision {
			rt.Fatalf("read back\n%s (%+v)\nkept\n%s (%+v)", a, got.Meta, b, meta)
		}
	})
}
