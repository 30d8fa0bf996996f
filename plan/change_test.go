package plan_test

import (
	"encoding/json"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// seedDoc is a small valid plan document: two nodes, train and a buffer
// on one, env on the other.
const seedDoc = `{"name":"default","revision":1,"created_at":"2026-11-30T00:00:00Z","reason":"first plan","mode":"auto","strategy":"disaggregate","env_strategy":"default","valid":true,"error":"","moved":4,
"demands":[{"component":"train","workers":2,"num_gpus":1,"num_cpus":1}],"capacity":{"gpus_required":2,"gpus_available":16,"cpus_required":2,"cpus_available":128},
"resource_pool":[{"name":"train_pool","num_node":1,"num_gpus":8,"train":"0-1"},{"name":"rollout_pool","num_node":1,"num_gpus":8,"env":"0"}],
"pools":[{"name":"train_pool","nodes":[{"node_id":"a","ip":"10.0.0.1","total_gpus":8,"total_cpus":64,"allocations":{"train":[[0,1]]},"worker_counts":{"train":[2]}}]},
{"name":"rollout_pool","nodes":[{"node_id":"b","ip":"10.0.0.2","total_gpus":8,"total_cpus":64,"allocations":{"env":[[0,0]]},"worker_counts":{"env":[1]}}]}],
"workers":[{"component":"train","index":0,"pool":"train_pool","node_id":"a","ip":"10.0.0.1","gpus":[0],"gpu_uuids":null,"gpu_share":1,"cpus":1},
{"component":"train","index":1,"pool":"train_pool","node_id":"a","ip":"10.0.0.1","gpus":[1],"gpu_uuids":null,"gpu_share":1,"cpus":1},
{"component":"env","index":0,"pool":"rollout_pool","node_id":"b","ip":"10.0.0.2","gpus":[0],"gpu_uuids":null,"gpu_share":0.25,"cpus":0},
{"component":"buffer","index":0,"pool":"train_pool","node_id":"a","ip":"10.0.0.1","gpus":null,"gpu_uuids":null,"gpu_share":0,"cpus":1}],
"storage_to_train_workers":{"0":[0,1]}}`

// seedChange moves env 0 from node b to node c.
const seedChange = `{"name":"default","revision":2,"valid":true,"moved":1,"base":1,"change":{
"nodes":[{"node_id":"b"},{"node_id":"c","workers":[{"component":"env","index":0,"pool":"rollout_pool","node_id":"c","ip":"10.0.0.3","gpus":[0],"gpu_uuids":null,"gpu_share":0.25,"cpus":0}],
"pools":{"rollout_pool":{"node_id":"c","ip":"10.0.0.3","total_gpus":8,"total_cpus":64,"allocations":{"env":[[0,0]]},"worker_counts":{"env":[1]}}}}],
"pools":[{"name":"train_pool"},{"name":"rollout_pool","drop":["b"],"add":["c"]}],"export":{"node_ids":[false,false],"worker_counts":[0,0,0]}}}`

// TestReplayApply: a change applied to its base gives the next revision:
// the node that lost its workers is gone, the one that took them is in
// the pool, the export follows.
func TestReplayApply(t *testing.T) {
	var base plan.Document
	var ev plan.Event
	if err := json.Unmarshal([]byte(seedDoc), &base); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(seedChange), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind() != "change" || !ev.Follows(1) || ev.Follows(2) {
		t.Fatalf("kind %s, follows 1 %v, follows 2 %v", ev.Kind(), ev.Follows(1), ev.Follows(2))
	}
	r := plan.NewReplay(&base)
	if err := r.Apply(&ev); err != nil {
		t.Fatal(err)
	}
	d := r.Document()
	if d.Revision != 2 || d.Workers.Len() != 4 || d.Pools[1].Nodes.At(0).NodeID != "c" || d.ResourcePool[1].NumNode != 1 {
		t.Fatalf("revision 2: %s", d.AppendJSON(nil))
	}
	if w := d.Workers.Find(plan.Env, 0); w == nil || w.NodeID != "c" {
		t.Errorf("env 0 on %v", w)
	}
	if err := r.Apply(&ev); err == nil {
		t.Error("the same change applied twice")
	}
	bad := ev
	bad.Revision = 3
	bad.Change = &plan.Change{Export: plan.ExportOptions{Counts: [3]int{-1, 0, 0}}}
	if err := r.Apply(&bad); err == nil {
		t.Error("negative worker_counts groups accepted")
	}
}

// FuzzReplay: no base document and event, however hostile, make a replay
// panic or fail to write its document.
func FuzzReplay(f *testing.F) {
	f.Add([]byte(seedDoc), []byte(seedChange))
	f.Add([]byte(seedDoc), []byte(`{"revision":2,"change":{"nodes":[{"node_id":"a","pools":{"x":{"allocations":{"train":[[5,2]]}}}}],"pools":[{"name":"x","nodes":["a","a"]}],"export":{"node_ids":[true],"worker_counts":[4096,1,0]}}}`))
	f.Fuzz(func(t *testing.T, doc, event []byte) {
		var base plan.Document
		var ev plan.Event
		if json.Unmarshal(doc, &base) != nil || json.Unmarshal(event, &ev) != nil {
			return
		}
		r := plan.NewReplay(&base)
		if r.Apply(&ev) != nil {
			return
		}
		_ = r.Document().AppendJSON(nil)
	})
}

// seedDegraded takes env 0's node b away: revision 2 is degraded, env 0
// unplaced where it ran.
const seedDegraded = `{"name":"default","revision":2,"valid":false,"error":"degraded: 1 worker unplaced (env 0: node left b): Insufficient GPUs","state":"degraded",
"unplaced":[{"component":"env","index":0,"reason":"node left b","pool":"rollout_pool","node_id":"b","gpus":[0],"gpu_uuids":["GPU-b-0"]}],
"pending_spec":{"reason":"Insufficient GPUs: required 4.0, available 2"},"moved":0,"base":1,"change":{
"nodes":[{"node_id":"b"}],"pools":[{"name":"train_pool"},{"name":"rollout_pool","drop":["b"]}],"export":{"node_ids":[false,false],"worker_counts":[0,0,0]}}}`

// TestReplayDegraded: a degraded revision travels as any other: its
// state, unplaced workers and pending spec are in the header, its
// placement what it still places; a document from before states reads
// as valid or invalid by its valid.
func TestReplayDegraded(t *testing.T) {
	var base plan.Document
	var ev plan.Event
	if err := json.Unmarshal([]byte(seedDoc), &base); err != nil {
		t.Fatal(err)
	}
	if base.PlanState() != plan.StateValid || !base.Placed() {
		t.Fatalf("a document from before states reads %q", base.PlanState())
	}
	if err := json.Unmarshal([]byte(seedDegraded), &ev); err != nil {
		t.Fatal(err)
	}
	r := plan.NewReplay(&base)
	if err := r.Apply(&ev); err != nil {
		t.Fatal(err)
	}
	d := r.Document()
	if d.PlanState() != plan.StateDegraded || !d.Placed() || d.Valid() || d.Workers.Len() != 3 || len(d.Unplaced) != 1 {
		t.Fatalf("revision 2: %s", d.AppendJSON(nil))
	}
	if u := d.Unplaced[0]; u.Component != plan.Env || u.NodeID != "b" || len(u.GPUs) != 1 || u.GPUUUIDs[0] != "GPU-b-0" || u.Reason != "node left b" {
		t.Errorf("unplaced %+v", u)
	}
	if d.PendingSpec == nil || d.PendingSpec.Reason == "" {
		t.Errorf("pending spec %+v", d.PendingSpec)
	}
	// Written and read back, the same.
	var back plan.Document
	if err := json.Unmarshal(d.AppendJSON(nil), &back); err != nil {
		t.Fatal(err)
	}
	if back.PlanState() != plan.StateDegraded || len(back.Unplaced) != 1 || back.PendingSpec == nil || back.Workers.Len() != 3 {
		t.Fatalf("read back: %s", back.AppendJSON(nil))
	}
	// Removed: nothing placed.
	back.Status = plan.Status{State: plan.StateInvalid, Reason: plan.ReasonRemoved}
	if back.Placed() || back.PlanState() != plan.StateInvalid {
		t.Errorf("a removed plan reads as %q", back.PlanState())
	}
}
