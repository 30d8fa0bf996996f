package service

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// keptPlanOf is a plan of n train workers, one GPU each, 8 to a node.
func keptPlanOf(rev, n int) *store.StoredPlan {
	doc := plan.Document{Header: plan.Header{Name: "p", Revision: rev, Status: plan.Status{State: plan.StateValid}}}
	ws := make([]plan.Worker, n)
	for i := range ws {
		node := fmt.Sprintf("node-%06d", i/8)
		ws[i] = plan.Worker{Component: plan.Train, Index: i, Pool: "train_pool", NodeID: node, IP: "10.0.0.1", GPUs: []int{i % 8},
			GPUUUIDs: []string{fmt.Sprintf("GPU-%08x-1111-2222-3333-%012x", i/8, i%8)}, CPUs: 1}
	}
	doc.Workers = plan.NewWorkers(ws)
	return &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{SpecDigest: "d1"}}
}

// BenchmarkKeepPlacement: what keeping a plan's latest revision beside
// the marks costs the loop at each revision, by plan size.
func BenchmarkKeepPlacement(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			sp := keptPlanOf(1, n)
			k := newMarks(filepath.Join(b.TempDir(), "revisions.json"))
			b.ReportAllocs()
			for b.Loop() {
				if err := k.keep("p", sp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
