package planner

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

const rlDir = "testdata/rlightning"

// rlNodes reads a rlightning cluster-info inventory.
func rlNodes(t *testing.T, name string) []Node {
	t.Helper()
	var info struct {
		Nodes map[string]struct {
			IP  string  `json:"ip"`
			CPU float64 `json:"CPU"`
			GPU int     `json:"GPU"`
		} `json:"node_id_to_resources"`
	}
	data, err := os.ReadFile(filepath.Join(rlDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &info); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var nodes []Node
	for id, r := range info.Nodes {
		nodes = append(nodes, Node{ID: id, IP: r.IP, CPUs: r.CPU, GPUs: r.GPU})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes
}

func readCase(t *testing.T, name, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rlDir, "cases", name, file))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRLightningFixtures plans each fixture's rlightning config and the
// spec derived by hand from setup_component_scheduling (expected.yaml):
// the same spec, and worker for worker and in the resource_pool export
// the same plan.
func TestRLightningFixtures(t *testing.T) {
	cases := []struct {
		name      string
		inventory string
		format    SpecFormat
		// assumed are the defaults the translation must say it took.
		assumed []string
	}{
		{"openpi_4t4e_libero_x4", "cluster-4x8gpu.json", FormatRLightningJob, nil},
		{"openpi_ddp_sharded_x2", "cluster-4x8gpu.json", FormatRLightningJob, nil},
		{"openpi_1t1e_cuda_buffer", "cluster-4x8gpu.json", FormatRLightningJob, nil},
		{"openvla_colocate_ddp_x8", "cluster-4x8gpu.json", FormatRLightningJob, nil},
		{"openvla_2t2e_manual", "cluster-1x8gpu.json", FormatRLightningJob, nil},
		{"cluster_openpi_4t4e_manual", "cluster-1x8gpu.json", FormatRLightningCluster, []string{"policy", "env", "buffer.storage"}},
		{"cluster_openvla_8t8e_colocate", "cluster-4x8gpu.json", FormatRLightningCluster, []string{"policy", "env", "buffer.storage"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, err := ReadSpec(readCase(t, c.name, "config.yaml"))
			if err != nil {
				t.Fatalf("read config: %v", err)
			}
			if src.Format != c.format {
				t.Errorf("format %v, want %v", src.Format, c.format)
			}
			var assumed []string
			for _, d := range src.Assumed {
				assumed = append(assumed, d.Field)
			}
			if !reflect.DeepEqual(assumed, c.assumed) {
				t.Errorf("assumed %q, want %q", assumed, c.assumed)
			}
			want, err := ParseSpec(readCase(t, c.name, "expected.yaml"))
			if err != nil {
				t.Fatalf("expected.yaml: %v", err)
			}
			if !reflect.DeepEqual(src.Spec, want) {
				t.Fatalf("spec\n got %+v\nwant %+v\nfrom:\n%s", src.Spec, want, src.Native)
			}
			again, err := ParseSpec(src.Native)
			if err != nil || !reflect.DeepEqual(again, src.Spec) {
				t.Fatalf("the translation does not read back as the spec (%v):\n%s", err, src.Native)
			}
			nodes := rlNodes(t, c.inventory)
			got, err := Compute(src.Spec, nodes)
			if err != nil {
				t.Fatalf("plan the config: %v", err)
			}
			exp, err := Compute(want, nodes)
			if err != nil {
				t.Fatalf("plan expected.yaml: %v", err)
			}
			gw, _ := json.Marshal(got.Workers)
			ew, _ := json.Marshal(exp.Workers)
			if string(gw) != string(ew) || got.Workers.Len() == 0 {
				t.Errorf("workers differ:\n got %s\nwant %s", gw, ew)
			}
			gy, err1 := got.ResourcePoolYAML()
			ey, err2 := exp.ResourcePoolYAML()
			if err1 != nil || err2 != nil || string(gy) != string(ey) {
				t.Errorf("resource_pool differs (%v, %v):\n got %s\nwant %s", err1, err2, gy, ey)
			}
		})
	}
}

// TestRLightningIgnored checks that the fields rlightning has and the
// scheduling does not read are listed, and those it reads are not.
func TestRLightningIgnored(t *testing.T) {
	src, err := ReadSpec(readCase(t, "openvla_colocate_ddp_x8", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for _, f := range src.Ignored {
		has[f] = true
	}
	for _, f := range []string{"engine", "log", "train", "imports", "cluster.enable_offload", "policy.model_cfg", "policy.weight_buffer", "buffer.capacity", "env[0].num_envs", "env[0].init_params", "env[0].num_action_chunks"} {
		if !has[f] {
			t.Errorf("%s not listed as ignored; got %q", f, src.Ignored)
		}
	}
	for _, f := range []string{"cluster", "env", "buffer", "policy", "cluster.train_worker_num", "cluster.placement", "env[0].num_workers", "env[0].num_gpus", "buffer.storage", "buffer.storage.type"} {
		if has[f] {
			t.Errorf("%s listed as ignored", f)
		}
	}
}

// TestRLightningRules checks each rule of setup_component_scheduling on
// small configs.
func TestRLightningRules(t *testing.T) {
	const base = "cluster: {train_worker_num: 2, eval_worker_num: 3, buffer_worker_num: 4, placement: {strategy: colocate}}\n"
	cases := []struct {
		name, config string
		// want is the native spec it must equal.
		want string
	}{
		{"unified forces one buffer", base + "buffer: {storage: {type: unified}}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"sharded keeps buffer_worker_num", base + "buffer: {storage: {type: sharded}}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 4, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"sharded takes num_shards", base + "buffer: {storage: {type: sharded, num_shards: 3}}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 3, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"sharded auto", "cluster: {buffer_worker_num: auto}\nbuffer: {storage: {type: sharded}}\n",
			"scheduling: {train: {worker_num: 1, num_gpus: 1}, eval: {worker_num: 1, num_gpus: 1}, buffer: {worker_num: auto, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}"},
		{"cuda storage takes a GPU", base + "buffer: {storage: {device: cuda}}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 1}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"policy GPUs and env groups", base + "policy: {train_num_gpus: 2, eval_num_gpus: 0.5}\nenv: [{num_workers: 8, num_cpus: 2, num_gpus: 0.25}, {num_gpus: 1}]\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 2}, eval: {worker_num: 3, num_gpus: 0.5}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 8, num_cpus: 2, num_gpus: 0.25}, {worker_num: 1, num_gpus: 1}]}\nplacement: {strategy: colocate}"},
		{"one env mapping", base + "env: {num_workers: 2, num_gpus: 0.5}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 2, num_gpus: 0.5}]}\nplacement: {strategy: colocate}"},
		{"numbers as pydantic reads them", "cluster: {train_worker_num: '4', eval_worker_num: 2.0}\nenv: [{num_workers: ' 3 ', num_gpus: '0.5'}]\n",
			"scheduling: {train: {worker_num: 4, num_gpus: 1}, eval: {worker_num: 2, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 3, num_gpus: 0.5}]}"},
		{"interpolations in ignored fields", base + "env: [{num_workers: 1, num_envs: '${..x}', video: {dir: '${log.dir}'}}]\nlog: {dir: '${oc.env:HOME}'}\ncluster_extra: '${nope}'\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 3, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"unknown keys ignored, as rlightning does", "cluster: {train_worker_num: 2, remote_storge: true, gpus_per_node: 8, placement: {strategy: colocate, spread: 1}}\n",
			"scheduling: {train: {worker_num: 2, num_gpus: 1}, eval: {worker_num: 1, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: colocate}"},
		{"no pools, no rewrite: 0.1 kept", "cluster: {train_each_gpu_num: 0.1, eval_each_gpu_num: 0.1}\nenv: [{num_gpus: 0.1}]\n",
			"scheduling: {train: {worker_num: 1, num_gpus: 1}, eval: {worker_num: 1, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0.1}]}"},
		{"default strategy planned disaggregate", "train_worker_num: 1\nplacement: {mode: auto, strategy: default}\n",
			"scheduling: {train: {worker_num: 1, num_gpus: 1}, eval: {worker_num: 1, num_gpus: 1}, buffer: {worker_num: 1, num_gpus: 0}, env: [{worker_num: 1, num_gpus: 0}]}\nplacement: {strategy: disaggregate}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, err := ReadSpec([]byte(c.config))
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			want, err := ParseSpec([]byte(c.want))
			if err != nil {
				t.Fatalf("want: %v", err)
			}
			if !reflect.DeepEqual(src.Spec, want) {
				t.Fatalf("got\n%s\nwant %+v", src.Native, want)
			}
		})
	}
}

// TestRLightningBadInput checks that a config rlightning would refuse,
// or that would plan something other than meant, is refused naming the
// field.
func TestRLightningBadInput(t *testing.T) {
	const job = "env: [{num_workers: 2}]\nbuffer: {storage: {type: unified}}\n"
	cases := []struct {
		name, config, field, msg string
	}{
		{"misspelt train_worker_num", "cluster: {train_worker_nums: 4}\n" + job, "cluster.train_worker_nums", "unknown key (did you mean train_worker_num?); rlightning would ignore it and take train_worker_num's default"},
		{"misspelt in a cluster group", "train_workers_num: 4\neval_worker_num: 4\n", "train_workers_num", "did you mean train_worker_num?"},
		{"words swapped", "cluster: {num_train_workers: 4}\n" + job, "cluster.num_train_workers", "did you mean train_worker_num?"},
		{"misspelt buffer_worker_num", "cluster: {bufer_worker_num: 4}\n" + job, "cluster.bufer_worker_num", "did you mean buffer_worker_num?"},
		{"non-number num_workers", "cluster: {}\nenv: [{num_workers: four}]\n", "env[0].num_workers", `"four" is not allowed; want a whole number >= 0`},
		{"fractional num_workers", "cluster: {}\nenv: [{num_workers: 1.5}]\n", "env[0].num_workers", "1.5 is not allowed"},
		{"negative num_workers", "cluster: {}\nenv: [{num_workers: -1}]\n", "env[0].num_workers", "-1 is not allowed"},
		{"boolean num_workers", "cluster: {}\nenv: [{num_workers: true}]\n", "env[0].num_workers", "true is not allowed"},
		{"list num_workers", "cluster: {}\nenv: [{num_workers: [1]}]\n", "env[0].num_workers", "a list is not allowed"},
		{"fractional env num_cpus", "cluster: {}\nenv: [{num_cpus: 0.5}]\n", "env[0].num_cpus", "0.5 is not allowed"},
		{"misspelt num_workers", "cluster: {}\nenv: [{num_worker: 4}]\n", "env[0].num_worker", "did you mean num_workers?"},
		{"unknown storage type", "cluster: {}\nbuffer: {storage: {type: ring}}\n", "buffer.storage.type", `"ring" is not allowed; want one of unified, sharded`},
		{"unknown storage device", "cluster: {}\nbuffer: {storage: {device: tpu}}\n", "buffer.storage.device", `"tpu" is not allowed; want one of cpu, cuda`},
		{"sharded on cuda", "cluster: {}\nbuffer: {storage: {type: sharded, device: cuda}}\n", "buffer.storage.device", "only supports cpu"},
		{"num_shards 0", "cluster: {}\nbuffer: {storage: {type: sharded, num_shards: 0}}\n", "buffer.storage.num_shards", "want a whole number >= 1"},
		{"num_shards null", "cluster: {}\nbuffer: {storage: {type: sharded, num_shards: null}}\n", "buffer.storage.num_shards", "nothing is not allowed"},
		{"bad buffer_worker_num", "cluster: {buffer_worker_num: many}\n", "cluster.buffer_worker_num", `want a whole number >= 0 or "auto"`},
		{"auto for train", "cluster: {train_worker_num: auto}\n", "cluster.train_worker_num", `"auto" is not allowed`},
		{"bad placement strategy", "cluster: {placement: {strategy: spread}}\n", "cluster.placement.strategy", "want one of default, disaggregate, colocate"},
		{"placement typo", "cluster: {placement: {stratgy: colocate}}\n", "cluster.placement.stratgy", "did you mean strategy?"},
		{"unresolved worker count", "cluster: {train_worker_num: '${oc.env:N}'}\n", "cluster.train_worker_num", "unresolved interpolation"},
		{"unresolved env GPUs", "cluster: {}\nenv: [{num_gpus: '${policy.x}'}]\n", "env[0].num_gpus", "unresolved interpolation"},
		{"unresolved pool", "cluster: {placement: {mode: manual}, resource_pool: [{name: p, num_node: 1, num_gpus: 8, train: '${x}'}]}\n", "cluster.resource_pool[0].train", "unresolved interpolation"},
		{"missing value", "cluster: {eval_worker_num: '???'}\n", "cluster.eval_worker_num", "marks missing"},
		{"train GPUs too many", "cluster: {}\npolicy: {train_num_gpus: 1.5}\n", "policy.train_num_gpus", "above 1 a worker takes whole GPUs"},
		{"misspelt train_num_gpus", "cluster: {}\npolicy: {train_num_gpu: 2}\n", "policy.train_num_gpu", "did you mean train_num_gpus?"},
		{"no cluster", "env: [{num_workers: 1}]\nbuffer: {storage: {type: unified}}\n", "cluster", "runs the job locally"},
		{"null cluster", "cluster: null\nenv: []\n", "cluster", "runs the job locally"},
		{"misspelt cluster", "clusters: {train_worker_num: 1}\nenv: []\n", "clusters", "did you mean cluster?"},
		{"manual without pools", "cluster: {placement: {mode: manual}}\n", "cluster.resource_pool", "resource_pool is empty"},
		{"bad pool", "cluster: {placement: {mode: manual}, resource_pool: [{name: p, num_node: 0, num_gpus: 8}]}\n", "cluster.resource_pool[0].num_node", "want a whole number >= 1"},
		{"hydra defaults", "defaults:\n  - resource_pool: global_pool\ntrain_worker_num: 2\n", "defaults", "--cfg job --resolve"},
		{"validated dump", "cluster: {train_each_gpu_num: 0.1, eval_each_gpu_num: 0.1, placement: {strategy: colocate}}\nenv: [{num_workers: 4, num_gpus: 0.1, num_cpus: 1}]\n", "env[0].num_gpus", "config.validated.yaml"},
		{"env not a list", "cluster: {}\nenv: libero\n", "env", "want a list of env configs"},
		{"env by name", "cluster: {}\nenv: {libero: {num_workers: 2}, maniskill: {num_workers: 1}}\n", "env", "a mapping of env configs by name"},
		{"buffer not a mapping", "cluster: {}\nbuffer: [1]\n", "buffer", "want a mapping"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadSpec([]byte(c.config))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a field error", err)
			}
			if fe.Field != c.field || !strings.Contains(fe.Msg, c.msg) {
				t.Fatalf("got %q, want field %s with %q", err, c.field, c.msg)
			}
		})
	}
}

// TestReadSpecNative checks that a native spec is read as ParseSpec
// reads it, errors included, and kept as it is.
func TestReadSpecNative(t *testing.T) {
	for _, doc := range []string{
		"scheduling: {train: {worker_num: 2}}\n",
		"scheduling: {train: {worker_num: 2}}\ncluster: {}\n", // native: cluster is refused as before
		"placement: {mode: auto}\n",
		"resource_pool: []\n",
		"",
		"[1, 2]",
		"scheduling: {train: {worker_num: 2}}\npriority: 3\nmax_gpus: 8\n",
		"schedulin: {}\n",
		"{",
	} {
		src, err := ReadSpec([]byte(doc))
		want, wantErr := ParseSpec([]byte(doc))
		switch {
		case wantErr != nil:
			if err == nil || err.Error() != wantErr.Error() {
				t.Errorf("%q: got %v, want %v", doc, err, wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", doc, err)
		case src.Format != FormatNative || string(src.Native) != doc || !reflect.DeepEqual(src.Spec, want):
			t.Errorf("%q: read as %v %+v", doc, src.Format, src.Spec)
		}
	}
}

// TestRLightningDefaultStrategy: rlightning's strategy "default" (no
// pools) is planned as disaggregate, and the translation says so; in
// manual mode the strategy means nothing and nothing is said.
func TestRLightningDefaultStrategy(t *testing.T) {
	for _, c := range []struct {
		config, field string
	}{
		{"train_worker_num: 1\n", "placement.strategy"},
		{"cluster: {placement: {strategy: default}}\n", "cluster.placement.strategy"},
		{"cluster: {placement: {mode: manual}, resource_pool: [{name: p, num_node: 1, num_gpus: 8, train: '0', eval: '1', env: '2'}]}\n", ""},
	} {
		src, err := ReadSpec([]byte(c.config))
		if err != nil {
			t.Fatalf("%q: %v", c.config, err)
		}
		var got string
		for _, d := range src.Assumed {
			if strings.HasSuffix(d.Field, "placement.strategy") {
				got = d.Field
				if d.Value != StrategyDisaggregate || d.Why == "" {
					t.Errorf("%q: assumed %+v", c.config, d)
				}
			}
		}
		if got != c.field || src.Spec.Placement.Strategy != StrategyDisaggregate {
			t.Errorf("%q: assumed strategy at %q, want %q; strategy %s", c.config, got, c.field, src.Spec.Placement.Strategy)
		}
	}
}
