package planner

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"
)

// rlGen draws a rlightning job or cluster config, with fields the
// scheduling does not read (interpolations among them) mixed in, and the
// spec setup_component_scheduling makes of it, worked out from the drawn
// values.
func rlGen(t *rapid.T) (config []byte, want *Spec) {
	gpus := rapid.SampledFrom([]float64{0, 0.25, 0.5, 1, 2, 4})
	// whole draws a count written as pydantic reads an int: a number, a
	// float like 4.0, or a string.
	whole := func(label string) (any, int) {
		n := rapid.IntRange(0, 12).Draw(t, label)
		switch rapid.IntRange(0, 2).Draw(t, label+"_as") {
		case 1:
			return float64(n), n
		case 2:
			return strconv.Itoa(n), n
		}
		return n, n
	}
	junk := func(label string) any {
		return rapid.SampledFrom([]any{"${log.log_dir}/x", "${..task}", 7, true, nil, "text", map[string]any{"a": "${oc.env:HOME}"}, []any{1, "${x}"}}).Draw(t, label)
	}
	addJunk := func(m map[string]any, label string, keys ...string) {
		for _, k := range keys {
			if rapid.Bool().Draw(t, label+"_"+k) {
				m[k] = junk(label + "_" + k + "_v")
			}
		}
	}

	cluster := map[string]any{}
	s := &Spec{}
	train, eval := &WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}, &WorkerGroup{WorkerNum: 1, NumCPUs: 1, NumGPUs: 1}
	if rapid.Bool().Draw(t, "has_train") {
		cluster["train_worker_num"], train.WorkerNum = whole("train")
	}
	if rapid.Bool().Draw(t, "has_eval") {
		cluster["eval_worker_num"], eval.WorkerNum = whole("eval")
	}
	bufferNum, bufferAuto := 1, false
	if rapid.Bool().Draw(t, "has_buffer_num") {
		if rapid.Bool().Draw(t, "buffer_auto") {
			cluster["buffer_worker_num"], bufferAuto = "auto", true
		} else {
			cluster["buffer_worker_num"], bufferNum = whole("buffer")
		}
	}
	s.Placement = Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}
	if rapid.Bool().Draw(t, "has_placement") {
		p := map[string]any{}
		if rapid.Bool().Draw(t, "has_strategy") {
			st := rapid.SampledFrom([]string{"default", StrategyDisaggregate, StrategyColocate}).Draw(t, "strategy")
			p["strategy"] = st
			if st != "default" {
				s.Placement.Strategy = st
			}
		}
		if rapid.Bool().Draw(t, "has_env_strategy") {
			es := rapid.SampledFrom([]string{EnvStrategyDefault, EnvStrategyDeviceColocate}).Draw(t, "env_strategy")
			p["env_strategy"], s.Placement.EnvStrategy = es, es
		}
		if rapid.Bool().Draw(t, "mode_given") {
			p["mode"] = ModeAuto
		}
		cluster["placement"] = p
	}
	addJunk(cluster, "cluster", "enable_offload", "remote_env", "ray_address", "is_colocated", "train_each_gpu_num")

	isCluster := rapid.Bool().Draw(t, "cluster_file")
	top := map[string]any{}
	if isCluster {
		top = cluster
		if DetectFormat(top) != FormatRLightningCluster {
			// Only placement: a native spec's key too, read as native.
			top["enable_offload"] = false
		}
	} else {
		top["cluster"] = cluster
		addJunk(top, "top", "engine", "log", "train", "debug", "imports")
	}

	s.Scheduling.Env = []WorkerGroup{{WorkerNum: 1, NumCPUs: 1}}
	if !isCluster && rapid.Bool().Draw(t, "has_env") {
		n := rapid.IntRange(0, 4).Draw(t, "env_groups")
		envs := make([]any, n)
		s.Scheduling.Env = make([]WorkerGroup, n)
		for i := range envs {
			e := map[string]any{}
			g := WorkerGroup{WorkerNum: 1, NumCPUs: 1}
			if rapid.Bool().Draw(t, "env_workers") {
				e["num_workers"], g.WorkerNum = whole("env_workers_n")
			}
			if rapid.Bool().Draw(t, "env_cpus") {
				var c int
				e["num_cpus"], c = whole("env_cpus_n")
				g.NumCPUs = float64(c)
			}
			if rapid.Bool().Draw(t, "env_gpus") {
				g.NumGPUs = gpus.Draw(t, "env_gpus_n")
				e["num_gpus"] = g.NumGPUs
			}
			addJunk(e, "env", "name", "num_envs", "seed", "video_cfg", "init_params", "num_action_chunks")
			envs[i] = e
			s.Scheduling.Env[i] = g
		}
		top["env"] = envs
		if n == 0 {
			s.Scheduling.Env = nil // as ParseSpec reads env: []
		}
	}

	kind, device := "unified", "cpu"
	if !isCluster && rapid.Bool().Draw(t, "has_buffer") {
		storage := map[string]any{}
		if rapid.Bool().Draw(t, "has_type") {
			kind = rapid.SampledFrom([]string{"unified", "sharded"}).Draw(t, "type")
			storage["type"] = kind
		}
		if kind == "unified" && rapid.Bool().Draw(t, "cuda") {
			device = "cuda"
			storage["device"] = device
		}
		if rapid.Bool().Draw(t, "has_shards") {
			n := rapid.IntRange(1, 8).Draw(t, "shards")
			storage["num_shards"] = n
			if kind == "sharded" {
				bufferNum, bufferAuto = n, false
			}
		}
		addJunk(storage, "storage", "mode", "unit")
		b := map[string]any{"storage": storage}
		addJunk(b, "buffer", "type", "capacity", "sampler")
		top["buffer"] = b
	}
	if kind == "unified" {
		bufferNum, bufferAuto = 1, false
	}
	buffer := &WorkerGroup{WorkerNum: bufferNum, Auto: bufferAuto, NumCPUs: 1}
	if bufferAuto {
		buffer.WorkerNum = 0
	}
	if device == "cuda" {
		buffer.NumGPUs = 1
	}

	if !isCluster && rapid.Bool().Draw(t, "has_policy") {
		p := map[string]any{}
		if rapid.Bool().Draw(t, "train_gpus") {
			train.NumGPUs = gpus.Draw(t, "train_gpus_n")
			p["train_num_gpus"] = train.NumGPUs
		}
		if rapid.Bool().Draw(t, "eval_gpus") {
			eval.NumGPUs = gpus.Draw(t, "eval_gpus_n")
			p["eval_num_gpus"] = eval.NumGPUs
		}
		addJunk(p, "policy", "type", "model_cfg", "optim_cfg", "weight_buffer")
		top["policy"] = p
	}
	s.Scheduling.Train, s.Scheduling.Eval, s.Scheduling.Buffer = train, eval, buffer
	data, err := yaml.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return data, s
}

// TestRLightningProperty: every drawn config reads as the spec its
// values make, whatever the fields the scheduling does not read hold,
// and its translation reads back as that spec.
func TestRLightningProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		data, want := rlGen(t)
		src, err := ReadSpec(data)
		if err != nil {
			t.Fatalf("%v\n%s", err, data)
		}
		if !reflect.DeepEqual(src.Spec, want) {
			t.Fatalf("config\n%s\nread as\n%s\nwant %+v", data, src.Native, want)
		}
		back, err := ParseSpec(src.Native)
		if err != nil || !reflect.DeepEqual(back, src.Spec) {
			t.Fatalf("translation does not read back (%v):\n%s", err, src.Native)
		}
	})
}

// FuzzReadSpec: whatever the input, ReadSpec answers without panicking,
// and a rlightning config it accepts stands for a spec that reads back.
func FuzzReadSpec(f *testing.F) {
	cases, _ := filepath.Glob(filepath.Join(rlDir, "cases", "*", "*.yaml"))
	for _, p := range cases {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("cluster: {train_worker_num: 2, placement: {mode: manual}, resource_pool: [{name: p, num_node: 1, num_gpus: 8, train: '0-1'}]}\n"))
	f.Add([]byte("train_worker_num: 1\nbuffer_worker_num: auto\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := ReadSpec(data)
		if err != nil {
			return
		}
		back, err := ParseSpec(src.Native)
		if err != nil || !reflect.DeepEqual(back, src.Spec) {
			t.Fatalf("translation does not read back (%v):\n%s", err, src.Native)
		}
	})
}
