package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/api"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// inv is a simulated node of gpus H100s and cpus CPUs, with sick GPUs.
func inv(id string, gpus, cpus int, sick ...int) inventory.NodeInventory {
	sim, _ := inventory.ParseSimulation(fmt.Sprintf("%dxH100", gpus))
	n := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: cpus}.Inventory()
	n.GPUs = inventory.SimulatedGPUs(id, sim)
	for _, g := range sick {
		n.GPUs[g].Healthy = false
	}
	return n
}

// TestValidateExplains: a validate reply carries, as structured JSON on the
// wire, each kind of reason with its node count and ids.
func TestValidateExplains(t *testing.T) {
	t.Parallel()
	nodes := func(ns ...inventory.NodeInventory) map[string]inventory.NodeInventory {
		out := map[string]inventory.NodeInventory{}
		for _, n := range ns {
			out[n.NodeID] = n
		}
		return out
	}
	var small []inventory.NodeInventory
	for i := range 30 {
		small = append(small, inv(fmt.Sprintf("s%02d", i), 2, 64))
	}
	cases := []struct {
		name   string
		nodes  map[string]inventory.NodeInventory
		spec   string
		comp   string
		list   string
		reason string
		count  int
		first  string
		valid  bool
	}{
		{"CPUs", nodes(inv("n1", 8, 4), inv("n2", 8, 4), inv("n3", 8, 4), inv("n4", 8, 64)),
			`{"scheduling": {"eval": {"worker_num": 8, "num_cpus": 2, "num_gpus": 1}}}`, "eval", "excluded", planner.ReasonCPUsExhausted, 3, "n1", true},
		{"too few GPUs", nodes(append(small, inv("b1", 8, 64), inv("b2", 8, 64))...),
			`{"scheduling": {"eval": {"worker_num": 5, "num_gpus": 4}}}`, "eval", "excluded", planner.TooFewGPUs(4), 30, "s00", false},
		{"unhealthy GPU", nodes(inv("node-01", 8, 64), inv("node-07", 8, 64, 3)),
			`{"scheduling": {"train": {"worker_num": 12, "num_gpus": 1}}}`, "train", "excluded", planner.ReasonUnhealthyGPU, 1, "node-07", true},
		{"pool purity", nodes(inv("n1", 8, 64), inv("n2", 8, 64)),
			`{"scheduling": {"train": {"worker_num": 12, "num_gpus": 1}, "eval": {"worker_num": 4, "num_gpus": 1}}}`, "eval", "compromises", planner.ReasonPoolShared, 1, "n2", true},
		{"manual pool without GPUs", nodes(inv("n1", 8, 64), inv("n2", 8, 64)),
			`{"scheduling": {"train": {"worker_num": 8, "num_gpus": 1}, "eval": {"worker_num": 4, "num_gpus": 1}}, "placement": {"mode": "manual"}, "resource_pool": [{"name": "p", "num_node": 1, "num_gpus": 8, "train": "0-7"}]}`,
			"eval", "excluded", planner.ReasonNoPoolGPUs, 0, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := drive(New(Config{}))
			for id, doc := range c.nodes {
				if _, err := p.live.put(id, doc); err != nil {
					t.Fatal(err)
				}
			}
			p.publishSnapshot(true) // as the loop does once it took them
			reply, err := p.Validate(context.Background(), []byte(c.spec), "")
			if err != nil {
				t.Fatal(err)
			}
			data, h, err := wire.Encode(reply)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Valid        bool `json:"valid"`
				Explanations []struct {
					Component string `json:"component"`
					Asked     int    `json:"asked"`
					Placed    int    `json:"placed"`
				} `json:"explanations"`
			}
			var raw struct {
				Explanations []map[string]json.RawMessage `json:"explanations"`
			}
			if err := wire.Decode(data, h, &got); err != nil || wire.Decode(data, h, &raw) != nil {
				t.Fatal(err)
			}
			if got.Valid != c.valid {
				t.Fatalf("valid %v, want %v", got.Valid, c.valid)
			}
			for i, x := range got.Explanations {
				if x.Component != c.comp {
					continue
				}
				var list []struct {
					Reason  string   `json:"reason"`
					Nodes   int      `json:"nodes"`
					NodeIDs []string `json:"node_ids"`
				}
				_ = json.Unmarshal(raw.Explanations[i][c.list], &list)
				for _, r := range list {
					if r.Reason == c.reason {
						if r.Nodes != c.count || c.first != "" && (len(r.NodeIDs) == 0 || r.NodeIDs[0] != c.first) {
							t.Errorf("%s: %+v, want %d nodes from %s", c.reason, r, c.count, c.first)
						}
						return
					}
				}
				t.Fatalf("%s %s lacks %q: %s", c.comp, c.list, c.reason, raw.Explanations[i][c.list])
			}
			t.Fatalf("no explanation for %s: %s", c.comp, data)
		})
	}
}

// TestValidateBounded: a spec placing more than ValidateMaxWorkers is
// validated whole, but the reply leaves out workers and pools and says
// so, staying small; a request over bus.MaxRequest is refused unread.
func TestValidateBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := drive(New(Config{NC: h.nc, JS: h.js, Settle: -1, Log: zerolog.Nop()}))
	// Enough nodes for a plan of 150,000 workers (planner.MaxNodeWorkers).
	for i := range 150000/planner.MaxNodeWorkers + 1 {
		id := fmt.Sprintf("n%d", i)
		if _, err := p.live.put(id, inv(id, 8, 64)); err != nil {
			t.Fatal(err)
		}
	}
	p.publishSnapshot(true) // as the loop does once it took them
	svc, err := bus.AddService(h.nc, api.Endpoints(p))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	c, _ := client.New(h.nc)
	ctx := context.Background()
	reply, err := c.Validate(ctx, []byte(`{"scheduling": {"env": [{"worker_num": 150000, "num_cpus": 0, "num_gpus": 0}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !reply.Valid() || reply.Workers.Len() != 0 || len(reply.Pools) != 0 || len(reply.ResourcePool) == 0 ||
		len(reply.Warnings) == 0 || !strings.Contains(reply.Warnings[len(reply.Warnings)-1], "150000 workers") {
		t.Fatalf("reply: valid %v, %d workers, %d pools, resource_pool %d, warnings %q", reply.Valid(), reply.Workers.Len(), len(reply.Pools), len(reply.ResourcePool), reply.Warnings)
	}
	small, err := c.Validate(ctx, []byte(`{"scheduling": {"train": {"worker_num": 4, "num_cpus": 1, "num_gpus": 1}}}`))
	if err != nil || small.Workers.Len() != 4 {
		t.Fatalf("a small spec: %v", err)
	}
	huge := []byte(`{"scheduling": {"train": {"worker_num": 4, "num_gpus": 1}}, "x": "` + strings.Repeat("x", bus.MaxRequest) + `"}`)
	if _, err := c.Validate(ctx, huge); !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), "at most 262144") {
		t.Errorf("a request over the limit: %v", err)
	}
}

// TestValidateOwnFaults: a spec refused for an error of its own (its
// quota) is told so alone, never put down to the plans beside it; one
// that lacks room others hold names them.
func TestValidateOwnFaults(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	stop := h.planner(ctx, "scheduling:\n  train: {worker_num: 24, num_cpus: 1, num_gpus: 1}\n")
	defer stop()
	h.waitRevision(1)
	c, _ := client.New(h.nc)
	cases := []struct {
		name, spec string
		reason     plan.Reason
		want       string
		others     bool
	}{
		{"over its quota, room enough", "scheduling:\n  train: {worker_num: 8, num_cpus: 1, num_gpus: 1}\nmax_gpus: 4\n",
			plan.ReasonQuota, "max_gpus: the plan needs 8 GPUs; its quota is 4", false},
		{"over its quota and the room", "scheduling:\n  train: {worker_num: 12, num_cpus: 1, num_gpus: 1}\nmax_gpus: 4\n",
			"", "max_gpus: the plan needs 12 GPUs; its quota is 4", false},
		{"room held by default", "scheduling:\n  train: {worker_num: 12, num_cpus: 1, num_gpus: 1}\n",
			"", "default (priority 0, 24 GPUs)", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := c.ValidateAs(ctx, "q", []byte(tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			if reply.Valid() || !strings.Contains(reply.Error, tc.want) || strings.Contains(reply.Error, "default") != tc.others {
				t.Fatalf("valid %v, error %q: want %q, naming default %v", reply.Valid(), reply.Error, tc.want, tc.others)
			}
			if tc.reason != "" && reply.Status.Reason != tc.reason {
				t.Errorf("status %+v, want reason %s", reply.Status, tc.reason)
			}
		})
	}
}

// TestValidateMovesAsReplan: validating an existing plan's new spec
// counts the workers the replan on it then moves (the same engine
// call), not 0.
func TestValidateMovesAsReplan(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		h.node(fmt.Sprintf("n%d", i))
	}
	stop := h.planner(ctx, testSpec)
	defer stop()
	h.waitRevision(1)
	h.waitPublished("default", 1)
	next := `
scheduling:
  train:  {worker_num: 8, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 4, num_cpus: 1, num_gpus: 4}
placement: {mode: auto, strategy: colocate, env_strategy: default}
`
	c, _ := client.New(h.nc)
	reply, err := c.ValidateAs(ctx, "default", []byte(next))
	if err != nil || !reply.Valid() {
		t.Fatalf("validate: %v (error %q)", err, reply.Error)
	}
	if _, err := store.NewSpecStore(h.js).Put(ctx, "default", []byte(next)); err != nil {
		t.Fatal(err)
	}
	second := h.waitRevision(2)
	if second.Moved == 0 || reply.Moved != second.Moved {
		t.Fatalf("validate said %d moved, revision 2 moved %d (%s)", reply.Moved, second.Moved, second.Reason)
	}
	if reply.Revision != 0 || reply.Reason != "validation: not published" {
		t.Errorf("reply revision %d reason %q: want an unpublished validation", reply.Revision, reply.Reason)
	}
}
