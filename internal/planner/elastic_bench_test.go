package planner

import (
	"fmt"
	"testing"
)

// elasticBench is n nodes of 8 GPUs and plan a: a quarter of the GPUs
// to train, eval elastic from 1000 up to every GPU, placed (as its
// previous plan) at eval so that free GPUs are left free.
func elasticBench(b *testing.B, n, free int) ([]Node, Job) {
	b.Helper()
	nodes, _ := benchCluster(n)
	gpus := 8 * n
	train := gpus / 4
	spec := &Spec{
		Scheduling: Scheduling{
			Train: &WorkerGroup{WorkerNum: train, NumCPUs: 1, NumGPUs: 1},
			Eval:  &WorkerGroup{WorkerNum: 1000, Min: 1000, Max: gpus, NumCPUs: 1, NumGPUs: 1},
		},
		Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
	}
	at := gpus - train - free
	prev, err := Compute(sized(spec, []int{at}), nodes)
	if err != nil {
		b.Fatal(err)
	}
	prev.Priority, prev.GPUsHeld = 0, HeldGPUs(prev)
	return nodes, Job{Name: "a", Spec: spec, Prev: prev, Age: 1}
}

// takerJob is plan b of priority 10 and k train workers, which takes
// the GPUs a shrink gives up.
func takerJob(k int) Job {
	return Job{Name: "b", Age: 2, Spec: &Spec{Priority: 10,
		Scheduling: Scheduling{Train: &WorkerGroup{WorkerNum: k, NumCPUs: 1, NumGPUs: 1}},
		Placement:  Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}}
}

// BenchmarkElastic: what a grow into k free GPUs, and a shrink of k for
// a plan of higher priority, cost at 20,000 nodes, beside a replan that
// changes nothing (steady) and the plan made afresh (afresh: what a
// grow or a shrink that read the whole cluster would cost at least). A
// grow or a shrink starts from the plan's state (resize.go), so its cost
// follows k, beside a floor of a few walks over the node list.
func BenchmarkElastic(b *testing.B) {
	const n = 20000
	b.Run(fmt.Sprintf("nodes=%d/afresh", n), func(b *testing.B) {
		nodes, a := elasticBench(b, n, 0)
		spec := sized(a.Spec, []int{countOf(a.Prev, "eval")})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Compute(spec, nodes); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("nodes=%d/steady", n), func(b *testing.B) {
		nodes, a := elasticBench(b, n, 0)
		b.ReportAllocs()
		for b.Loop() {
			if o := PlanAll([]Job{a}, nodes)[0]; o.Err != nil || o.Plan.Moved != 0 {
				b.Fatalf("steady: %v moved %d", o.Err, o.Plan.Moved)
			}
		}
	})
	// taker: the shrink's new plan of k train workers placed on a free
	// cluster alone, the part of a shrink's cost that is not the resize.
	for _, k := range []int{8, 800} {
		b.Run(fmt.Sprintf("nodes=%d/taker=%d", n, k), func(b *testing.B) {
			nodes, _ := benchCluster(n)
			taker := takerJob(k)
			b.ReportAllocs()
			for b.Loop() {
				if o := PlanAll([]Job{taker}, nodes)[0]; o.Err != nil {
					b.Fatal(o.Err)
				}
			}
		})
	}
	// replanned: the shrink of a plan made by an incremental replan, as
	// a running planner's plans are: its state's table is merged from an
	// earlier one, no single slice of nodes.
	b.Run(fmt.Sprintf("nodes=%d/shrink=8/replanned", n), func(b *testing.B) {
		nodes, a := elasticBench(b, n, 0)
		o := PlanAll([]Job{a}, nodes)[0]
		if o.Err != nil || o.Plan.state == nil || o.Plan.state.nodes != nil {
			b.Fatalf("replan: %v, want a merged state", o.Err)
		}
		o.Plan.GPUsHeld = HeldGPUs(o.Plan)
		a.Prev = o.Plan
		want := countOf(a.Prev, "eval") - 8
		taker := takerJob(8)
		b.ReportAllocs()
		var out []Outcome
		for b.Loop() {
			out = PlanAll([]Job{a, taker}, nodes)
		}
		if out[0].Err != nil || out[1].Err != nil || countOf(out[0].Plan, "eval") != want {
			b.Fatalf("shrink: %v %v eval %d, want %d", out[0].Err, out[1].Err, countOf(out[0].Plan, "eval"), want)
		}
	})
	// The same from a plan made by a replan, as a running planner's are
	// (a plan made afresh differs in its export: the first replan writes
	// worker_counts): what changes nothing, and a grow by 1.
	for _, k := range []int{0, 1} {
		name := fmt.Sprintf("nodes=%d/grow=%d/replanned", n, k)
		if k == 0 {
			name = fmt.Sprintf("nodes=%d/steady/replanned", n)
		}
		b.Run(name, func(b *testing.B) {
			nodes, a := elasticBench(b, n, k)
			o := PlanAllWith([]Job{a}, nodes, ElasticOptions{NoGrow: true})[0]
			if o.Err != nil || o.Plan.state == nil {
				b.Fatalf("replan: %v", o.Err)
			}
			o.Plan.GPUsHeld = HeldGPUs(o.Plan)
			a.Prev = o.Plan
			want := countOf(a.Prev, "eval") + k
			b.ReportAllocs()
			var out Outcome
			for b.Loop() {
				out = PlanAll([]Job{a}, nodes)[0]
			}
			if out.Err != nil || countOf(out.Plan, "eval") != want {
				b.Fatalf("grow: %v eval %d, want %d", out.Err, countOf(out.Plan, "eval"), want)
			}
		})
	}
	// k from 1 to 8,000 (a thousandth to a twentieth of the GPUs): what
	// grows with k beside the floor every shrink or grow pays.
	for _, k := range []int{1, 8, 800, 8000} {
		b.Run(fmt.Sprintf("nodes=%d/grow=%d", n, k), func(b *testing.B) {
			nodes, a := elasticBench(b, n, k)
			want := countOf(a.Prev, "eval") + k
			b.ReportAllocs()
			var o Outcome
			for b.Loop() {
				o = PlanAll([]Job{a}, nodes)[0]
			}
			// Checked after the loop: counting 160,000 workers in it
			// would be a third of what a grow of one costs.
			if o.Err != nil || countOf(o.Plan, "eval") != want {
				b.Fatalf("grow: %v eval %d, want %d", o.Err, countOf(o.Plan, "eval"), want)
			}
		})
		b.Run(fmt.Sprintf("nodes=%d/shrink=%d", n, k), func(b *testing.B) {
			nodes, a := elasticBench(b, n, 0)
			want := countOf(a.Prev, "eval") - k
			taker := takerJob(k)
			b.ReportAllocs()
			var out []Outcome
			for b.Loop() {
				out = PlanAll([]Job{a, taker}, nodes)
			}
			if out[0].Err != nil || out[1].Err != nil || countOf(out[0].Plan, "eval") != want {
				b.Fatalf("shrink: %v %v eval %d, want %d", out[0].Err, out[1].Err, countOf(out[0].Plan, "eval"), want)
			}
		})
	}
}
