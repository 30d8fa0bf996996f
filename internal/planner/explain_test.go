package planner

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// explainCase is a cluster and spec where one kind of reason shapes a
// component's placement.
type explainCase struct {
	name  string
	nodes []Node
	spec  string
	comp  plan.Component
	// list is "excluded" or "compromises"; want the reason, its node count
	// and its first node ids.
	list  string
	want  plan.ReasonCount
	valid bool
	// err is part of the error of an invalid plan.
	err string
	// joinedToo: the node that joins for the incremental plan is excluded
	// for the same reason.
	joinedToo bool
}

func explainCases() []explainCase {
	small := uniformNodes(30, 2, 64)
	for i := range small {
		small[i].ID = fmt.Sprintf("s%02d", i)
	}
	cpus := uniformNodes(4, 8, 4)
	cpus[3].CPUs = 64
	sick := uniformNodes(8, 8, 64)
	for i := range sick {
		sick[i].ID = fmt.Sprintf("node-%02d", i+1)
	}
	sick[6].Unhealthy = []int{3}
	return []explainCase{
		{
			name: "CPUs", nodes: cpus, comp: plan.Eval, list: "excluded", valid: true,
			spec: "scheduling: {eval: {worker_num: 8, num_cpus: 2, num_gpus: 1}}\n",
			want: plan.ReasonCount{Reason: ReasonCPUsExhausted, Nodes: 3, NodeIDs: []string{"n1", "n2", "n3"}},
		},
		{
			name: "too few GPUs for a multi-GPU worker", nodes: append(uniformNodes(2, 8, 64), small...), comp: plan.Eval, list: "excluded",
			spec:      "scheduling: {eval: {worker_num: 5, num_cpus: 1, num_gpus: 4}}\n",
			want:      plan.ReasonCount{Reason: TooFewGPUs(4), Nodes: 30, NodeIDs: []string{"s00", "s01", "s02", "s03", "s04", "s05", "s06", "s07"}},
			err:       "Cannot place eval: 4 of 5 workers placed; the next needs 4 GPU and 1 CPU; fewer than 4 healthy GPUs on 30 nodes (s00,",
			joinedToo: true,
		},
		{
			name: "unhealthy GPU", nodes: sick, comp: plan.Train, list: "excluded", valid: true,
			spec: "scheduling: {train: {worker_num: 60, num_cpus: 1, num_gpus: 1}}\n",
			want: plan.ReasonCount{Reason: ReasonUnhealthyGPU, Nodes: 1, NodeIDs: []string{"node-07"}},
		},
		{
			name: "pool purity gives way", nodes: uniformNodes(2, 8, 64), comp: plan.Eval, list: "compromises", valid: true,
			spec: "scheduling: {train: {worker_num: 12, num_gpus: 1}, eval: {worker_num: 4, num_gpus: 1}}\n",
			want: plan.ReasonCount{Reason: ReasonPoolShared, Nodes: 1, NodeIDs: []string{"n2"}},
		},
		{
			name: "manual pool without GPUs", nodes: uniformNodes(2, 8, 64), comp: plan.Eval, list: "excluded",
			spec: "scheduling: {train: {worker_num: 8, num_gpus: 1}, eval: {worker_num: 4, num_gpus: 1}}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, train: \"0-7\"}]\n",
			want: plan.ReasonCount{Reason: ReasonNoPoolGPUs},
			err:  "Cannot place eval: 4 workers, but no resource pool gives eval any GPUs",
		},
	}
}

// TestExplanations: each kind of reason appears, with its text and
// counts, in the component's explanation of a fresh plan, of the
// incremental plan after an unrelated node joins, and in the text output;
// an invalid plan's error is built from it.
func TestExplanations(t *testing.T) {
	for _, c := range explainCases() {
		t.Run(c.name, func(t *testing.T) {
			spec := mustSpec(t, c.spec)
			fresh, err := Compute(spec, c.nodes)
			joined := append(slices.Clone(c.nodes), Node{ID: "zz-new", CPUs: 8, GPUs: c.nodes[len(c.nodes)-1].GPUs})
			next, ch, _ := Replan(fresh, spec, joined)
			checkExplanation(t, "fresh", c, fresh)
			var b strings.Builder
			_ = WriteText(&b, fresh)
			if !strings.Contains(b.String(), c.want.String()) {
				t.Errorf("text lacks %q:\n%s", c.want.String(), b.String())
			}
			if c.joinedToo {
				c.want.Nodes++
			}
			checkExplanation(t, "incremental", c, next)
			if c.valid && (err != nil || ch.Fresh || next.Moved != 0) {
				t.Errorf("fresh err %v, replan %+v moved %d", err, ch, next.Moved)
			}
			if !c.valid && !strings.Contains(fresh.Error, c.err) {
				t.Errorf("error %q, want %q", fresh.Error, c.err)
			}
		})
	}
}

func checkExplanation(t *testing.T, which string, c explainCase, p *Plan) {
	t.Helper()
	if p.Valid() != c.valid {
		t.Fatalf("%s: valid %v (%s), want %v", which, p.Valid(), p.Error, c.valid)
	}
	x := explanationOf(p, c.comp)
	if x == nil {
		t.Fatalf("%s: no explanation for %s in %+v", which, c.comp, p.Explanations)
	}
	list := x.Excluded
	if c.list == "compromises" {
		list = x.Compromises
	}
	i := slices.IndexFunc(list, func(r plan.ReasonCount) bool { return r.Reason == c.want.Reason })
	if i < 0 {
		t.Fatalf("%s: %s %s lacks %q: %+v", which, c.comp, c.list, c.want.Reason, list)
	}
	if got := list[i]; got.Nodes != c.want.Nodes || !slices.Equal(got.NodeIDs, c.want.NodeIDs) {
		t.Errorf("%s: %+v, want %+v", which, got, c.want)
	}
	asked := 0
	for _, d := range p.Demands {
		if d.Component == c.comp {
			asked += d.Workers
		}
	}
	if x.Asked != asked || (c.valid && x.Placed != asked) || (!c.valid && x.Placed >= asked) {
		t.Errorf("%s: %d of %d placed, spec asks %d", which, x.Placed, x.Asked, asked)
	}
}

// TestWhyLeavesOutGPUlessNodes: a node without GPUs (the quick start's
// machine beside simulated GPU nodes) is no part of the why of a
// component placed in full, though its note stays; where a component
// falls short it is named with the rest.
func TestWhyLeavesOutGPUlessNodes(t *testing.T) {
	vm := uniformNodes(1, 0, 8)[0]
	vm.ID = "vm"
	nodes := append(uniformNodes(4, 8, 128), vm)
	read := func(path string) *Spec {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return mustSpec(t, string(data))
	}
	quick := read("../../examples/disaggregate.yaml")
	held, err := Compute(quick, nodes)
	if err != nil {
		t.Fatal(err)
	}
	others := []Job{{Name: "default", Spec: quick, Prev: held}}
	cases := []struct {
		name  string
		spec  *Spec
		named bool
	}{
		// As planner validate examples/experiment.yaml beside the quick
		// start's plan: the packer passes every node by, the vm too.
		{"placed in full", read("../../examples/experiment.yaml"), false},
		{"short", mustSpec(t, "scheduling:\n  eval: {worker_num: 2, num_cpus: 100, num_gpus: 4}\n"), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, _ := PlanBeside(c.spec, nodes, others)
			named := false
			for _, x := range p.Explanations {
				for _, rc := range x.Excluded {
					named = named || rc.Reason == ReasonNoGPUs
				}
			}
			if named != c.named {
				t.Errorf("why names %q: %v, want %v: %+v", ReasonNoGPUs, named, c.named, p.Explanations)
			}
			if !slices.ContainsFunc(p.Notes, func(n plan.Note) bool { return n.NodeID == "vm" && n.Reason == ReasonNoGPUs }) {
				t.Errorf("the vm's note is gone: %+v", p.Notes)
			}
		})
	}
}
