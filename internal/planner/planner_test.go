package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/poolplanner/poolplanner/plan"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestParseIndexString(t *testing.T) {
	cases := []struct {
		in   string
		want []plan.Range
		err  bool
	}{
		{"0-7", []plan.Range{{First: 0, Last: 7}}, false},
		{"0-3, 8-11", []plan.Range{{First: 0, Last: 3}, {First: 8, Last: 11}}, false},
		{"5", []plan.Range{{First: 5, Last: 5}}, false},
		{"", nil, false},
		{"7-0", []plan.Range{{First: 0, Last: 7}}, false},
		{" 1 , 2-3 ", []plan.Range{{First: 1, Last: 1}, {First: 2, Last: 3}}, false},
		{"a", nil, true},
		{"1-", nil, true},
		{"-1", nil, true},
		{"1-2-3", nil, true},
	}
	for _, c := range cases {
		got, err := plan.ParseIndexString(c.in)
		if (err != nil) != c.err || !reflect.DeepEqual(got, c.want) {
			t.Errorf("plan.ParseIndexString(%q) = %v, %v; want %v, err=%v", c.in, got, err, c.want, c.err)
		}
	}
	if got := plan.FormatRanges([]plan.Range{{First: 0, Last: 7}, {First: 8, Last: 8}}); got != "0-7, 8" {
		t.Errorf("FormatRanges = %q", got)
	}
}

func specT(t *testing.T, s string) *Spec {
	t.Helper()
	spec, err := ParseSpec([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestParseSpecDefaults(t *testing.T) {
	s := specT(t, "scheduling:\n  buffer: {worker_num: auto}\n  env: {worker_num: 3, num_gpus: 0.5}\n")
	if s.Placement != (Placement{ModeAuto, StrategyDisaggregate, EnvStrategyDefault}) {
		t.Errorf("placement %+v", s.Placement)
	}
	if !s.Scheduling.Buffer.Auto || s.Scheduling.Buffer.NumCPUs != 1 || len(s.Scheduling.Env) != 1 {
		t.Errorf("scheduling %+v", s.Scheduling)
	}
	if _, err := ParseSpec([]byte("scheduling: {train: {worker_num: 1}}\nplacement: {mode: manual}\n")); err == nil || !strings.Contains(err.Error(), "resource_pool") {
		t.Errorf("manual without pools: %v", err)
	}
	// A spec of no workers exports no pools, and that loads back.
	if _, err := ParseSpec([]byte("scheduling: {}\nplacement: {mode: manual}\nresource_pool: []\n")); err != nil {
		t.Errorf("manual spec of no workers: %v", err)
	}
}

// TestUnhealthyGPUsGetNoWork: a GPU marked unhealthy is skipped, and the
// node's pool-global index space still counts it.
func TestUnhealthyGPUsGetNoWork(t *testing.T) {
	spec := specT(t, "scheduling: {train: {worker_num: 8, num_gpus: 1}}\nplacement: {strategy: colocate}\n")
	nodes := []Node{{ID: "a", CPUs: 64, GPUs: 4, Unhealthy: []int{1}}, {ID: "b", CPUs: 64, GPUs: 8}}
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range p.Workers.Slice() {
		if w.NodeID == "a" && w.GPUs[0] == 1 {
			t.Fatalf("worker %d on unhealthy GPU", w.Index)
		}
	}
	// b has more usable GPUs, so it is visited first; a gets the rest.
	if got := p.ResourcePool[0].Indices[0].Index; got != "0-7" {
		t.Errorf("train %q, want 0-7 (all on b)", got)
	}
	found := false
	for _, n := range p.Notes {
		found = found || (n.NodeID == "a" && n.Reason == ReasonUnhealthyGPU)
	}
	if !found {
		t.Errorf("no note for the unhealthy GPU: %v", p.Notes)
	}
}

func TestMultiGPUWorkers(t *testing.T) {
	spec := specT(t, "scheduling: {eval: {worker_num: 3, num_gpus: 4}}\n")
	nodes := []Node{{ID: "a", CPUs: 64, GPUs: 6}, {ID: "b", CPUs: 64, GPUs: 6}, {ID: "c", CPUs: 64, GPUs: 4}}
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int{"a": {0, 1, 2, 3}, "b": {0, 1, 2, 3}, "c": {0, 1, 2, 3}}
	for _, w := range p.Workers.Slice() {
		if !reflect.DeepEqual(w.GPUs, want[w.NodeID]) || w.GPUShare != 1 {
			t.Errorf("eval[%d] on %s GPUs %v share %v", w.Index, w.NodeID, w.GPUs, w.GPUShare)
		}
	}
	_, err = Compute(specT(t, "scheduling: {eval: {worker_num: 1, num_gpus: 8}}\n"), nodes)
	if err == nil || !strings.Contains(err.Error(), "needs 8 GPUs of one node") || !strings.Contains(err.Error(), "has 6 usable") {
		t.Errorf("too-big worker: %v", err)
	}
}

func TestExportAddsNodeIDsOnlyWhenNeeded(t *testing.T) {
	spec := specT(t, "scheduling: {train: {worker_num: 12, num_gpus: 1}, eval: {worker_num: 4, num_gpus: 1}}\n")
	same := []Node{{ID: "a", CPUs: 9, GPUs: 8}, {ID: "b", CPUs: 9, GPUs: 8}, {ID: "c", CPUs: 9, GPUs: 8}}
	p, err := Compute(spec, same)
	if err != nil {
		t.Fatal(err)
	}
	// train_pool is a, b (loading picks them); rollout_pool is c.
	for _, e := range p.ResourcePool {
		if e.NodeIDs != nil {
			t.Errorf("%s has node_ids %v; loading without them picks the same nodes", e.Name, e.NodeIDs)
		}
	}
	mixed := []Node{{ID: "a", CPUs: 64, GPUs: 4}, {ID: "b", CPUs: 64, GPUs: 8}, {ID: "c", CPUs: 64, GPUs: 8}}
	p, err = Compute(spec, mixed)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	y, _ := p.ResourcePoolYAML()
	buf.Write(y)
	if !strings.Contains(buf.String(), "node_ids: [b, c]") || !strings.Contains(buf.String(), "node_ids: [a]") {
		t.Errorf("mixed cluster export lacks node_ids:\n%s", buf.String())
	}
}

func TestPlanDocumentJSONRoundTrip(t *testing.T) {
	spec := specT(t, "scheduling: {train: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 1}, env: [{worker_num: 6, num_gpus: 0.5}]}\nplacement: {strategy: colocate}\n")
	p, err := Compute(spec, []Node{{ID: "a", IP: "10.0.0.1", CPUs: 64, GPUs: 8, GPUUUIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back Plan
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.ResourcePool, p.ResourcePool) || !reflect.DeepEqual(back.Pools, p.Pools) || !reflect.DeepEqual(back.Workers.Slice(), p.Workers.Slice()) {
		t.Errorf("round trip differs:\n%s", b)
	}
	if p.Workers.At(0).GPUUUIDs[0] != "u0" {
		t.Errorf("uuids %v", p.Workers.At(0).GPUUUIDs)
	}
}

func TestTextFoldsIdenticalNodes(t *testing.T) {
	nodes := make([]Node, 500)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("n%03d", i), CPUs: 64, GPUs: 8}
	}
	spec := specT(t, "scheduling: {train: {worker_num: 2000, num_gpus: 1}, env: [{worker_num: 4000, num_gpus: 0.25}]}\n")
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteText(&buf, p); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if n := strings.Count(out, "\n"); n > 30 {
		t.Errorf("text is %d lines for 500 nodes:\n%s", n, out)
	}
	for _, want := range []string{"n000..n249 (250)", "TTTTTTTT", "n250..n374 (125)", "VVVVVVVV"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

// TestTextFoldsTruthfully: the map folds only nodes that draw alike
// (model included) and whose ids follow one another in natural order, so
// that "a..b (n)" names exactly n nodes; long index strings are shortened
// between whole items.
func TestTextFoldsTruthfully(t *testing.T) {
	many := func(prefix string, n, gpus int, model string) []Node {
		var out []Node
		for i := 1; i <= n; i++ {
			nd := Node{ID: fmt.Sprintf("%s%d", prefix, i), CPUs: 64, GPUs: gpus}
			for range gpus {
				nd.Models = append(nd.Models, model)
			}
			out = append(out, nd)
		}
		return out
	}
	gone := many("sim-h100-", 4, 8, h100)
	gone[2].GPUs, gone[2].Models = 0, nil // sim-h100-3 takes no part
	cases := []struct {
		name  string
		nodes []Node
		spec  string
		want  []string // lines the text has, in order
		not   []string
	}{
		{name: "natural order", nodes: many("sim3-gb200-", 18, 4, "NVIDIA GB200"), spec: "scheduling: {train: {worker_num: 72, num_gpus: 1}}\n",
			want: []string{"sim3-gb200-1..sim3-gb200-18 (18)"}, not: []string{"sim3-gb200-2 "}},
		{name: "a node between", nodes: gone, spec: "scheduling: {train: {worker_num: 24, num_gpus: 1}}\n",
			want: []string{"sim-h100-1..sim-h100-2 (2)", "sim-h100-4 "}, not: []string{"sim-h100-2..sim-h100-4"}},
		{name: "models apart", nodes: append(many("h", 2, 8, h100), Node{ID: "h3", CPUs: 64, GPUs: 8, Models: slices.Repeat([]string{l40s}, 8)}),
			spec: "scheduling: {train: {worker_num: 24, num_gpus: 1}}\n",
			want: []string{"h1..h2 (2)", "H100 80GB HBM3", "h3 ", "L40S"}, not: []string{"h1..h3"}},
		{name: "index cut between items", nodes: many("n", 24, 4, "NVIDIA GB200"), spec: "scheduling: {train: {worker_num: 96, num_gpus: 1}}\n",
			want: []string{`"0-3, 4-7, 8-11, 12-15, 16-19, 20-23, 24-27, 28-31, ... (9 more), 68-71, 72-75, 76-79, 80-83, 84-87, 88-91, 92-95"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Compute(specT(t, c.spec), c.nodes)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := WriteText(&buf, p); err != nil {
				t.Fatal(err)
			}
			rest := buf.String()
			for _, want := range c.want {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Fatalf("text lacks %q (in turn):\n%s", want, buf.String())
				}
				rest = rest[i+len(want):]
			}
			for _, not := range c.not {
				if strings.Contains(buf.String(), not) {
					t.Errorf("text has %q:\n%s", not, buf.String())
				}
			}
		})
	}
}

// TestPoolsOnlyAgrees: planning without recording workers gives the same
// pools, export and verdict.
func TestPoolsOnlyAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, spec := genNodes(t), genSpec(t)
		full, err1 := Compute(spec, nodes)
		lean, err2 := ComputeWith(spec, nodes, Options{PoolsOnly: true})
		if (err1 == nil) != (err2 == nil) || full.Error != lean.Error {
			t.Fatalf("verdicts differ: %v vs %v", err1, err2)
		}
		if !reflect.DeepEqual(full.ResourcePool, lean.ResourcePool) || !reflect.DeepEqual(full.Pools, lean.Pools) {
			t.Fatalf("pools differ")
		}
		if lean.Workers.Len() != 0 {
			t.Fatalf("pools-only plan has %d workers", lean.Workers.Len())
		}
	})
}

// TestCPUOnlyWorkersWait: workers that need no GPU are placed after every
// GPU worker, so that their CPUs do not leave a GPU group nowhere to go
// (placed in index order, 38 env workers of 10 CPUs would take every
// rollout node's CPUs before the 8 GPU env workers come).
func TestCPUOnlyWorkersWait(t *testing.T) {
	spec := specT(t, `
scheduling:
  train: {worker_num: 8, num_cpus: 4, num_gpus: 1}
  env:
    - {worker_num: 38, num_cpus: 10, num_gpus: 0}
    - {worker_num: 8, num_cpus: 1, num_gpus: 0.5}
`)
	nodes := []Node{{ID: "a", CPUs: 128, GPUs: 8}, {ID: "b", CPUs: 128, GPUs: 8}, {ID: "c", CPUs: 128, GPUs: 8}, {ID: "d", CPUs: 128, GPUs: 8}}
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range checkPlan(spec, nodes, p) {
		t.Error(e)
	}
}

// TestEmptyInventorySaysGPUs: on no nodes at all a spec that asks for
// GPUs is short of GPUs first (a planner's first look, before any
// reporter); one that asks none is short of CPUs.
func TestEmptyInventorySaysGPUs(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"scheduling:\n  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}\n", "Insufficient GPUs: required 2.0, available 0"},
		{"scheduling:\n  env:\n    - {worker_num: 4, num_cpus: 1, num_gpus: 0}\n", "Insufficient CPUs: required 4.0, available 0.0"},
	} {
		spec, err := ParseSpec([]byte(c.spec))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Compute(spec, nil); err == nil || err.Error() != c.want {
			t.Errorf("%q on no nodes: %v, want %q", c.spec, err, c.want)
		}
	}
}

// TestWorkerBound: a plan places at most MaxNodeWorkers workers a node,
// whatever they need (a worker of no GPU and no CPU included): a spec
// asking more than the inventory's nodes hold at that is refused before
// anything is made per worker, naming its largest group's field, by
// Compute, Replan and PlanAll alike; one at the bound is placed.
func TestWorkerBound(t *testing.T) {
	nodes := []Node{{ID: "a", CPUs: 64, GPUs: 8}, {ID: "b", CPUs: 64, GPUs: 8}, {ID: "c", CPUs: 64, GPUs: 8}}
	limit := len(nodes) * MaxNodeWorkers
	for _, c := range []struct {
		name, spec, want string
	}{
		{"two million of nothing", "scheduling: {train: {worker_num: 2000000, num_gpus: 0, num_cpus: 0}}\n",
			"scheduling.train.worker_num: 2000000 workers in all, more than this cluster can hold: 3 nodes at most 1024 workers each, 3072 in all"},
		{"one over", fmt.Sprintf("scheduling: {env: [{worker_num: %d, num_gpus: 0, num_cpus: 0}]}\n", limit+1),
			"scheduling.env.worker_num: 3073 workers in all"},
		{"summed over groups", fmt.Sprintf("scheduling:\n  train: {worker_num: 8, num_gpus: 1, num_cpus: 0}\n  env:\n    - {worker_num: 10, num_gpus: 0, num_cpus: 0}\n    - {worker_num: %d, num_gpus: 0.001, num_cpus: 0}\n", limit-10), "scheduling.env[1].worker_num: 3080 workers in all"},
		{"at the bound", fmt.Sprintf("scheduling: {env: [{worker_num: %d, num_gpus: 0, num_cpus: 0}]}\n", limit), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := specT(t, c.spec)
			check := func(how string, p *Plan, err error) {
				t.Helper()
				if c.want == "" {
					if err != nil || p.Workers.Len() != limit {
						t.Fatalf("%s: %v, %d workers", how, err, p.Workers.Len())
					}
					return
				}
				var pe *PlanError
				if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), c.want) {
					t.Fatalf("%s: %v, want %q", how, err, c.want)
				}
				if p != nil && p.Workers.Len() != 0 {
					t.Fatalf("%s: an invalid plan places %d workers", how, p.Workers.Len())
				}
			}
			p, err := Compute(spec, nodes)
			check("Compute", p, err)
			prev := specT(t, "scheduling: {train: {worker_num: 4, num_gpus: 1}}\n")
			pp, err := Compute(prev, nodes)
			if err != nil {
				t.Fatal(err)
			}
			p, _, err = Replan(pp, spec, nodes)
			check("Replan", p, err)
			out := PlanAll([]Job{{Name: "big", Spec: spec}, {Name: "small", Spec: prev, Prev: pp}}, nodes)
			check("PlanAll", out[0].Plan, out[0].Err)
			if out[1].Err != nil || out[1].Plan.Workers.Len() != 4 {
				t.Fatalf("the other plan: %v", out[1].Err)
			}
		})
	}
}

// BenchmarkWorkerBound: refusing the two-million-worker spec of no
// resources costs what the spec's size does, not its count (well under
// a millisecond here: 2 µs and 3 KB; 0.44 s and 355 MB a Compute before
// the bound, and the service then stored and published it all).
func BenchmarkWorkerBound(b *testing.B) {
	spec, err := ParseSpec([]byte("scheduling: {train: {worker_num: 2000000, num_gpus: 0, num_cpus: 0}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	nodes := []Node{{ID: "a", CPUs: 64, GPUs: 8}, {ID: "b", CPUs: 64, GPUs: 8}, {ID: "c", CPUs: 64, GPUs: 8}}
	for b.Loop() {
		if _, err := Compute(spec, nodes); err == nil {
			b.Fatal("placed")
		}
	}
}
