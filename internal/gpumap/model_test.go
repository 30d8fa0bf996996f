package gpumap

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// TestBuildFoldsAlikeOnly: a run folds only nodes of one GPU model that
// draw alike, in the ids' natural order (node-2 before node-10), and its
// count is the nodes from its first to its last.
func TestBuildFoldsAlikeOnly(t *testing.T) {
	node := func(id, model string) inventory.NodeInventory {
		d := inventory.NodeInventory{NodeID: id, IP: "10.0.0.1", CPUs: 64}
		for g := range 4 {
			d.GPUs = append(d.GPUs, inventory.GPU{Index: g, Name: model, Healthy: true})
		}
		return d
	}
	var nodes []inventory.NodeInventory
	for i := 1; i <= 12; i++ {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i), "NVIDIA H100 80GB HBM3"))
	}
	for i := 13; i <= 14; i++ {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i), "NVIDIA L40S"))
	}
	m := Build(nil, nodes)
	var got []string
	for _, r := range m.Rows {
		got = append(got, fmt.Sprintf("%s..%s (%d) %s", r.First, r.Last, r.Count, r.Model))
	}
	want := []string{"n1..n12 (12) NVIDIA H100 80GB HBM3", "n13..n14 (2) NVIDIA L40S"}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %q, want %q", got, want)
	}
}

// cluster is n nodes of 8 GPUs (every 97th with GPU 3 unhealthy) and a
// plan on it: train on a quarter of the GPUs, env at a quarter GPU each
// on the next half of a quarter (one GPU held in part).
func cluster(t testing.TB, n int) ([]inventory.NodeInventory, *planner.Plan) {
	t.Helper()
	docs := make([]inventory.NodeInventory, n)
	nodes := make([]planner.Node, n)
	for i := range docs {
		id := fmt.Sprintf("node-%05d", i)
		d := inventory.NodeInventory{NodeID: id, IP: "10.0.0.1", CPUs: 128}
		for g := range 8 {
			d.GPUs = append(d.GPUs, inventory.GPU{Index: g, UUID: fmt.Sprintf("GPU-%d-%d", i, g), Name: "NVIDIA H100", Healthy: !(i%97 == 0 && g == 3)})
		}
		docs[i] = d
		pn, err := d.PlannerNode()
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = pn
	}
	spec := &planner.Spec{Scheduling: planner.Scheduling{
		Train: &planner.WorkerGroup{WorkerNum: 2 * n, NumCPUs: 1, NumGPUs: 1},
		Env:   []planner.WorkerGroup{{WorkerNum: 4*n + 2, NumCPUs: 0, NumGPUs: 0.25}},
	}, Placement: planner.Placement{Mode: planner.ModeAuto, Strategy: planner.StrategyDisaggregate, EnvStrategy: planner.EnvStrategyDefault}}
	p, err := planner.Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.Revision = "big", 1
	return docs, p
}

// TestBuildFolds: 20,000 nodes fold into rows a browser draws at once;
// unhealthy GPUs and fractional shares are kept, and every node is in one
// row.
func TestBuildFolds(t *testing.T) {
	docs, p := cluster(t, 20000)
	m := Build([]*planner.Plan{p}, docs)
	if m.Nodes != 20000 || m.GPUs != 160000 {
		t.Fatalf("%d nodes, %d GPUs", m.Nodes, m.GPUs)
	}
	total, sick, partial := 0, 0, 0
	for _, r := range m.Rows {
		total += r.Count
		for _, c := range r.Cells {
			if c.Unhealthy {
				sick += r.Count
			}
			for _, h := range c.Held {
				if h.Share < 1 {
					partial++
				}
			}
		}
	}
	if total != 20000 || sick != 207 || partial == 0 || len(m.Rows) > 1000 {
		t.Fatalf("%d rows for %d nodes, %d unhealthy GPUs", len(m.Rows), total, sick)
	}
	b, _ := json.Marshal(m)
	t.Logf("20,000 nodes: %d rows, %d KB of JSON, %d partly held cells", len(m.Rows), len(b)>>10, partial)
}

func TestInspect(t *testing.T) {
	docs, p := cluster(t, 4)
	w := p.Workers.At(0)
	info, err := Inspect([]*planner.Plan{p}, docs, w.NodeID, w.GPUs[0])
	if err != nil || len(info.Workers) != 1 || info.Workers[0].Component != w.Component || info.UUID != w.GPUUUIDs[0] {
		t.Fatalf("%+v, %v", info, err)
	}
	if len(info.Workers[0].Why) == 0 {
		t.Fatal("no why")
	}
	for _, c := range []struct {
		node string
		gpu  int
	}{{"nope", 0}, {"node-00000", 8}} {
		if _, err := Inspect([]*planner.Plan{p}, docs, c.node, c.gpu); err == nil {
			t.Errorf("%s GPU %d: no error", c.node, c.gpu)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	docs, p := cluster(b, 20000)
	for b.Loop() {
		Build([]*planner.Plan{p}, docs)
	}
}

// TestBuildReserved: GPUs a plan's pool holds with no worker on them
// (a manual range) are drawn as held, and Inspect says by whom.
func TestBuildReserved(t *testing.T) {
	docs, _ := cluster(t, 2)
	nodes := make([]planner.Node, len(docs))
	for i, d := range docs {
		nodes[i], _ = d.PlannerNode()
	}
	spec, err := planner.ParseSpec([]byte(`
scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1}}
placement: {mode: manual}
resource_pool: [{name: train_pool, num_node: 1, num_gpus: 8, node_ids: [node-00001], train: "0-7"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := planner.Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "manual"
	m := Build([]*planner.Plan{p}, docs)
	var row *Row
	for i := range m.Rows {
		if m.Rows[i].First == "node-00001" {
			row = &m.Rows[i]
		}
	}
	if row == nil || len(row.Cells[7].Held) != 1 || row.Cells[7].Held[0].Share != 0 || row.Cells[0].Held[0].Share != 1 {
		t.Fatalf("row %+v", row)
	}
	info, err := Inspect([]*planner.Plan{p}, docs, "node-00001", 7)
	if err != nil || len(info.Workers) != 0 || len(info.Reserved) != 1 || !strings.Contains(info.Reserved[0], "plan manual") {
		t.Fatalf("%+v, %v", info, err)
	}
}

// TestBuildUnplannedUse: a GPU that runs a process with no worker placed
// on it is marked with its processes, counted, and not folded with
// GPUs alike but for that; a busy GPU a worker is placed on is not.
func TestBuildUnplannedUse(t *testing.T) {
	docs, p := cluster(t, 8)
	busy := []inventory.Process{{PID: 4242, Name: "python"}}
	// Train 0's GPU runs its process; a GPU no worker is on runs one.
	w := p.Workers.Find("train", 0)
	for i := range docs {
		if docs[i].NodeID == w.NodeID {
			docs[i].GPUs[w.GPUs[0]].Processes = busy
		}
	}
	idleNode, idle := -1, -1
	for i := range docs {
		for g := range 8 {
			if idle < 0 && !slices.ContainsFunc(p.OnNode(docs[i].NodeID), func(x plan.Worker) bool { return slices.Contains(x.GPUs, g) }) {
				idleNode, idle = i, g
			}
		}
	}
	if idle < 0 {
		t.Fatal("no GPU without a worker")
	}
	docs[idleNode].GPUs[idle].Processes = busy
	m := Build([]*planner.Plan{p}, docs)
	if m.Unplanned != 1 {
		t.Fatalf("%d GPUs in unplanned use, want 1", m.Unplanned)
	}
	var marked []string
	for _, r := range m.Rows {
		for g, c := range r.Cells {
			if len(c.Unplanned) > 0 {
				marked = append(marked, fmt.Sprintf("%s..%s gpu %d pid %d", r.First, r.Last, g, c.Unplanned[0].PID))
			}
		}
	}
	want := []string{fmt.Sprintf("%s.. gpu %d pid 4242", docs[idleNode].NodeID, idle)}
	if !slices.Equal(marked, want) {
		t.Errorf("marked %q, want %q", marked, want)
	}
}

// TestBuildDrained: a drained node's GPUs, and a drained GPU, are
// marked with why (leaving, before a deadline), and a drained node no
// longer folds with its neighbours.
func TestBuildDrained(t *testing.T) {
	docs, p := cluster(t, 40)
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	later := now.Add(time.Hour)
	gpu := 5
	drains := []plan.Drain{
		{NodeID: "node-00020", Cause: plan.DrainOperator, Reason: "driver upgrade"},
		{NodeID: "node-00030", GPU: &gpu, Cause: plan.DrainFlapping},
		{NodeID: "node-00031", Cause: plan.DrainOperator, Deadline: &later},
	}
	m := BuildDrained([]*planner.Plan{p}, docs, drains, now)
	want := map[string][]string{
		"node-00020": slices.Repeat([]string{"drained (driver upgrade)"}, 8),
		"node-00030": {"", "", "", "", "", "flapping", "", ""},
		"node-00031": slices.Repeat([]string{"leaving at " + later.Format(time.RFC3339)}, 8),
	}
	found := 0
	for _, r := range m.Rows {
		for id, w := range want {
			if plan.CompareNodeIDs(r.First, id) > 0 || r.Count > 1 && plan.CompareNodeIDs(r.Last, id) < 0 || r.Count == 1 && r.First != id {
				continue
			}
			if r.Count != 1 {
				t.Errorf("%s folded into %s .. %s", id, r.First, r.Last)
				continue
			}
			found++
			for g, c := range r.Cells {
				if c.Drained != w[g] {
					t.Errorf("%s GPU %d: drained %q, want %q", id, g, c.Drained, w[g])
				}
			}
		}
	}
	if found != len(want) {
		t.Errorf("%d of the %d drained nodes have a row of their own", found, len(want))
	}
	for _, c := range []struct {
		node string
		gpu  int
		want string
	}{{"node-00030", 5, "flapping"}, {"node-00030", 4, ""}, {"node-00020", 0, "drained (driver upgrade)"}, {"node-00001", 0, ""}} {
		if got := drainedText(drains, c.node, c.gpu, now); got != c.want {
			t.Errorf("%s GPU %d: %q, want %q", c.node, c.gpu, got, c.want)
		}
	}
}
