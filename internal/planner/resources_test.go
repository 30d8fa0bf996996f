package planner

import (
	"reflect"
	"strings"
	"testing"
)

func TestPoolAndAllocationAPI(t *testing.T) {
	spec := specT(t, "scheduling: {train: {worker_num: 12, num_gpus: 1}, buffer: {worker_num: auto}, eval: {worker_num: 2, num_gpus: 1}, env: [{worker_num: 4, num_gpus: 0.5}]}\n")
	nodes := []Node{{ID: "a", CPUs: 64, GPUs: 8}, {ID: "b", CPUs: 64, GPUs: 8}}
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	tp := p.Pools[0]
	if got := tp.ComponentTypes(); !reflect.DeepEqual(got, []Component{Train, Buffer}) {
		t.Errorf("component types %v", got)
	}
	if tp.IndexString(Train) != "0-7, 8-11" || tp.NodeCount(Train) != 2 || tp.TotalGPUs() != 16 {
		t.Errorf("train pool %q %d %d", tp.IndexString(Train), tp.NodeCount(Train), tp.TotalGPUs())
	}
	// b is in both pools: rollout takes its leftover, as its own pool.
	rp := p.Pools[1]
	if rp.IndexString(Eval) != "4-5" || rp.IndexString(Env) != "6-7" {
		t.Errorf("rollout pool eval %q env %q", rp.IndexString(Eval), rp.IndexString(Env))
	}
	if got := rp.Nodes[0].AvailableGPUs(&nodes[1]); got != 4 {
		t.Errorf("available on b in rollout_pool = %d, want 4", got)
	}
	a := p.Allocation(Train)
	if a.TotalGPUs() != 12 || a.Workers != 12 || a.IndexString() != "0-7, 0-3" || a.NodeIndexString("b") != "0-3" {
		t.Errorf("train allocation %d %d %q %q", a.TotalGPUs(), a.Workers, a.IndexString(), a.NodeIndexString("b"))
	}
	d := tp.Dict()
	if d["train"] != "0-7, 8-11" || d["num_node"] != 2 {
		t.Errorf("dict %v", d)
	}
	if s := p.Summary(); !strings.Contains(s, "train_pool: 2 nodes, 16 GPUs") || !strings.Contains(s, "env workers: 4") {
		t.Errorf("summary:\n%s", s)
	}
	c := nodes[0].Clone()
	c.Unhealthy = append(c.Unhealthy, 1)
	if len(nodes[0].Unhealthy) != 0 {
		t.Errorf("clone shares state")
	}
}
