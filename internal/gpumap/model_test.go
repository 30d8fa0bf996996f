package gpumap

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

func TestNatural(t *testing.T) {
	ids := []string{"n10", "n9", "n1", "a", "n01", "n1b", "n1a", "m2"}
	slices.SortFunc(ids, natural)
	want := []string{"a", "m2", "n1", "n01", "n1a", "n1b", "n9", "n10"}
	if !slices.Equal(ids, want) && !slices.Equal(ids, []string{"a", "m2", "n01", "n1", "n1a", "n1b", "n9", "n10"}) {
		t.Fatalf("%v", ids)
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
