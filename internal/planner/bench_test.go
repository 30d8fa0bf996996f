package planner

import (
	"fmt"
	"testing"
)

// benchCluster is the benchmark cluster: n nodes of 8 GPUs and a spec for
// fifteen sixteenths of them (a cluster keeps some room): a quarter of the
// GPUs to train, a quarter to eval, the rest to env at 0.25 each.
func benchCluster(n int) ([]Node, *Spec) {
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("node-%05d", i), IP: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), CPUs: 256, GPUs: 8}
	}
	gpus := 8 * (n - n/16)
	spec := &Spec{
		Scheduling: Scheduling{
			Train:  &WorkerGroup{WorkerNum: gpus / 4, NumCPUs: 1, NumGPUs: 1},
			Eval:   &WorkerGroup{WorkerNum: gpus / 4, NumCPUs: 1, NumGPUs: 1},
			Buffer: &WorkerGroup{Auto: true, NumCPUs: 1},
			Env:    []WorkerGroup{{WorkerNum: gpus / 2 * 4, NumCPUs: 0, NumGPUs: 0.25}},
		},
		Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
	}
	return nodes, spec
}

func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{100, 1000, 10000, 20000} {
		nodes, spec := benchCluster(n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := Compute(spec, nodes)
				if err != nil || !p.Valid {
					b.Fatalf("plan: %v", err)
				}
			}
		})
	}
}

// BenchmarkReplan is the cost of a replan after k nodes that host workers
// leave: the engine keeps every other worker and places the displaced
// ones on the nodes with room. Compare with BenchmarkPlan in the same run.
func BenchmarkReplan(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		nodes, spec := benchCluster(n)
		prev, err := Compute(spec, nodes)
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range []int{1, 32} {
			after := leave(nodes, n-n/16, k)
			b.Run(fmt.Sprintf("nodes=%d/leave=%d", n, k), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p, ch, err := Replan(prev, spec, after)
					if err != nil || ch.Fresh || p.Moved == 0 {
						b.Fatalf("replan: %v, %+v", err, ch)
					}
				}
			})
		}
	}
}

// leave drops k nodes spread over the first used ones.
func leave(nodes []Node, used, k int) []Node {
	gone := map[int]bool{}
	for i := range k {
		gone[i*(used/k)+used/(2*k)] = true
	}
	var out []Node
	for i, n := range nodes {
		if !gone[i] {
			out = append(out, n)
		}
	}
	return out
}

// BenchmarkPlanPoolsOnly is the planning `planner plan --output yaml`
// needs: every worker packed, none recorded.
func BenchmarkPlanPoolsOnly(b *testing.B) {
	nodes, spec := benchCluster(20000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ComputeWith(spec, nodes, Options{PoolsOnly: true}); err != nil {
			b.Fatal(err)
		}
	}
}
