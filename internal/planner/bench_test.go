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
				if err != nil || !p.Valid() {
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

// BenchmarkPlanConstrained is BenchmarkPlan's cluster and demand on
// mixed nodes: half H100 in zone a, a quarter H200 and a quarter L40S in
// zone b, 18 nodes to an NVLink domain; train wants H100 packed by
// domain, eval 80 GB in zone b (the H200s), env anything. Compare with BenchmarkPlan/nodes=20000 in the same run.
func BenchmarkPlanConstrained(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		nodes, spec := benchCluster(n)
		zones := []map[string]string{{"zone": "a"}, {"zone": "b"}}
		for i := range nodes {
			model, mem, zone := "NVIDIA H100 80GB HBM3", uint64(81559<<20), zones[0]
			switch i % 4 {
			case 2:
				model, mem, zone = "NVIDIA H200", 143771<<20, zones[1]
			case 3:
				model, mem, zone = "NVIDIA L40S", 46068<<20, zones[1]
			}
			nodes[i].Labels = zone
			nodes[i].Domain = fmt.Sprintf("rack-%d", i/18)
			for range nodes[i].GPUs {
				nodes[i].Models = append(nodes[i].Models, model)
				nodes[i].MemoryBytes = append(nodes[i].MemoryBytes, mem)
			}
		}
		spec.Scheduling.Train.Constraints = &Constraints{GPUModels: []string{"H100"}, NVLinkDomain: DomainPack}
		spec.Scheduling.Eval.Constraints = &Constraints{NodeSelector: map[string]string{"zone": "b"}, MinGPUMemoryGB: 80}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := Compute(spec, nodes)
				if err != nil || !p.Valid() {
					b.Fatalf("plan: %v", err)
				}
			}
		})
	}
}

// BenchmarkPlanAll replans 20 plans sharing 5,000 nodes of 8 GPUs (each
// plan 1,800 GPUs: train, eval and env at a quarter GPU; priorities 0 to
// 3) after one node, which a plan uses, leaves.
func BenchmarkPlanAll(b *testing.B) {
	nodes, _ := benchCluster(5000)
	jobs := make([]Job, 20)
	for i := range jobs {
		jobs[i] = Job{Name: fmt.Sprintf("plan-%02d", i), Age: uint64(i), Spec: &Spec{
			Scheduling: Scheduling{
				Train:  &WorkerGroup{WorkerNum: 450, NumCPUs: 1, NumGPUs: 1},
				Eval:   &WorkerGroup{WorkerNum: 450, NumCPUs: 1, NumGPUs: 1},
				Buffer: &WorkerGroup{Auto: true, NumCPUs: 1},
				Env:    []WorkerGroup{{WorkerNum: 3600, NumCPUs: 0, NumGPUs: 0.25}},
			},
			Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
			Priority:  i % 4,
		}}
	}
	for j, o := range PlanAll(jobs, nodes) {
		if o.Err != nil {
			b.Fatalf("%s: %v", jobs[j].Name, o.Err)
		}
		jobs[j].Prev = o.Plan
	}
	after := leave(nodes, 100, 1)
	b.ReportAllocs()
	for b.Loop() {
		moved := 0
		for j, o := range PlanAll(jobs, after) {
			if o.Err != nil {
				b.Fatalf("%s: %v", jobs[j].Name, o.Err)
			}
			moved += o.Plan.Moved
		}
		if moved == 0 {
			b.Fatal("nothing moved")
		}
	}
}

// BenchmarkBufferAdded is a replan that adds a buffer to a plan of
// 32,000 train workers on 4,000 nodes: every buffer is new, and each is
// compared with the previous plan's (none) without reading every worker
// for each (review rev12: 0.5-1 s where this is ~25 ms).
func BenchmarkBufferAdded(b *testing.B) {
	nodes, _ := benchCluster(4000)
	spec := &Spec{
		Scheduling: Scheduling{Train: &WorkerGroup{WorkerNum: 8 * 4000, NumCPUs: 1, NumGPUs: 1}},
		Placement:  Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault},
	}
	prev, err := Compute(spec, nodes)
	if err != nil {
		b.Fatal(err)
	}
	withBuffer := *spec
	withBuffer.Scheduling.Buffer = &WorkerGroup{Auto: true, NumCPUs: 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, ch, err := Replan(prev, &withBuffer, nodes); err != nil || ch.Fresh {
			b.Fatalf("replan: %v, %+v", err, ch)
		}
	}
}
