package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

const rlCases = "../planner/testdata/rlightning/cases"

// rlCase is the config and the hand-derived spec of one fixture.
func rlCase(name string) (config, expected string) {
	return filepath.Join(rlCases, name, "config.yaml"), filepath.Join(rlCases, name, "expected.yaml")
}

// TestPlanRLightningFixtures: planner plan of each fixture's rlightning
// config prints what it prints for the spec setup_component_scheduling
// gives (expected.yaml): the same resource_pool in -o yaml, the same
// workers in -o json.
func TestPlanRLightningFixtures(t *testing.T) {
	for _, c := range []struct{ name, inventory string }{
		{"openpi_4t4e_libero_x4", "cluster-4x8gpu.json"},
		{"openpi_ddp_sharded_x2", "cluster-4x8gpu.json"},
		{"openpi_1t1e_cuda_buffer", "cluster-4x8gpu.json"},
		{"openvla_colocate_ddp_x8", "cluster-4x8gpu.json"},
		{"openvla_2t2e_manual", "cluster-1x8gpu.json"},
		{"cluster_openpi_4t4e_manual", "cluster-1x8gpu.json"},
		{"cluster_openvla_8t8e_colocate", "cluster-4x8gpu.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			config, expected := rlCase(c.name)
			inv := filepath.Join(rlCases, "..", c.inventory)
			code, got, errOut := run(t, "plan", "--inventory", inv, "--spec", config, "-o", "yaml")
			if code != 0 || errOut != "" {
				t.Fatalf("plan -o yaml of the config: exit %d: %s", code, errOut)
			}
			_, want, _ := run(t, "plan", "--inventory", inv, "--spec", expected, "-o", "yaml")
			if got != want || !strings.HasPrefix(got, "resource_pool:\n") {
				t.Errorf("-o yaml\n got %s\nwant %s", got, want)
			}
			workers := func(spec string) string {
				code, out, errOut := run(t, "plan", "--inventory", inv, "--spec", spec, "-o", "json")
				var doc struct {
					Workers json.RawMessage `json:"workers"`
				}
				if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
					t.Fatalf("plan -o json of %s: exit %d: %s", spec, code, errOut)
				}
				return string(doc.Workers)
			}
			if g, w := workers(config), workers(expected); g != w || g == "[]" {
				t.Errorf("workers\n got %s\nwant %s", g, w)
			}
			code, text, _ := run(t, "plan", "--inventory", inv, "--spec", config)
			if code != 0 || !strings.Contains(text, "spec: rlightning ") || !strings.Contains(text, "read as the scheduling rlightning builds from it") {
				t.Errorf("text output does not say the spec was a rlightning config: exit %d\n%s", code, text)
			}
			if strings.HasPrefix(c.name, "cluster_") && !strings.Contains(text, "assumed rlightning's defaults: policy {train_num_gpus: 1.0, eval_num_gpus: 1.0}; env [{num_workers: 1, num_cpus: 1, num_gpus: 0.0}]; buffer.storage {type: unified, device: cpu}") {
				t.Errorf("text output of a cluster group does not list the defaults it assumed:\n%s", text)
			}
		})
	}
}

// TestRLightningBadInputExits2: a misspelt train_worker_num, a
// num_workers that is no number, an unknown storage type: every command
// that takes a spec exits 2 with one line naming the field, before
// anything else.
func TestRLightningBadInputExits2(t *testing.T) {
	const rest = "env: [{num_workers: 2}]\nbuffer: {storage: {type: unified}}\npolicy: {type: p}\n"
	cases := []struct{ name, config, want string }{
		{"misspelt train_worker_num", "cluster: {train_worker_nun: 4, eval_worker_num: 4}\n" + rest, "cluster.train_worker_nun: unknown key (did you mean train_worker_num?); rlightning would ignore it"},
		{"misspelt in a cluster group", "train_worker_nums: 4\neval_worker_num: 4\n", "train_worker_nums: unknown key (did you mean train_worker_num?)"},
		{"non-number num_workers", "cluster: {train_worker_num: 4}\nenv: [{num_workers: four}]\n", `env[0].num_workers: "four" is not allowed; want a whole number >= 0`},
		{"unknown storage type", "cluster: {train_worker_num: 4}\nbuffer: {storage: {type: ring}}\n", `buffer.storage.type: "ring" is not allowed; want one of unified, sharded`},
	}
	// Nothing listens there: a command that went on to connect would
	// fail otherwise.
	server := "nats://" + freeAddr(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, "job.yaml", c.config)
			for _, args := range [][]string{
				{"plan", "--inventory", inv, "--spec", p},
				{"plan", "--inventory", inv, "--spec", p, "-o", "json"},
				{"validate", "--spec", p, "--server", server},
				{"spec", "set", "--plan", "x", p, "--server", server},
				{"spec", "convert", p},
				{"serve", "--spec", p, "--listen", freeAddr(t), "--data-dir", t.TempDir(), "--no-local-reporter"},
			} {
				code, out, errOut := run(t, args...)
				if code != 2 || out != "" || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
					t.Errorf("%s: exit %d\nstdout %q\nstderr %q\nwant exit 2 and %q", strings.Join(args[:2], " "), code, out, errOut, c.want)
				}
			}
		})
	}
}

// TestSpecConvert: spec convert prints the spec a config stands for,
// which reads back as it, under comments listing what it assumed and
// ignored; a poolplanner spec comes out as it is.
func TestSpecConvert(t *testing.T) {
	config, expected := rlCase("openvla_colocate_ddp_x8")
	code, out, errOut := run(t, "spec", "convert", config)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	got, err := planner.ParseSpec([]byte(out))
	if err != nil {
		t.Fatalf("the output is no spec: %v\n%s", err, out)
	}
	data, _ := os.ReadFile(expected)
	want, _ := planner.ParseSpec(data)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant %s", out, data)
	}
	for _, line := range []string{
		"# poolplanner spec of rlightning job config " + config + ": the scheduling setup_component_scheduling builds\n",
		"rlightning fields, which the scheduling does not read:\n",
		"#   engine, imports, log, train\n",
		"#   cluster: enable_offload\n",
		"#   buffer: capacity, sampler, type\n",
		"#   env[0]: action_dim, auto_reset, backend, evaluate_cfg,",
		"\nscheduling:\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}

	clusterFile, _ := rlCase("cluster_openpi_4t4e_manual")
	_, out, _ = run(t, "spec", "convert", clusterFile)
	for _, line := range []string{"# assumed rlightning's defaults (the config does not give them):\n", "#   env: [{num_workers: 1, num_cpus: 1, num_gpus: 0.0}]\n", "#   eval_each_gpu_num, train_each_gpu_num\n"} {
		if !strings.Contains(out, line) {
			t.Errorf("output of a cluster group lacks %q:\n%s", line, out)
		}
	}

	native, _ := os.ReadFile(spec)
	if code, out, _ := run(t, "spec", "convert", spec); code != 0 || out != string(native) {
		t.Errorf("a poolplanner spec: exit %d\n%s", code, out)
	}
	if code, _, errOut := run(t, "spec", "convert", "nope.yaml"); code != 2 || !strings.Contains(errOut, "convert: open nope.yaml") {
		t.Errorf("a missing file: exit %d: %s", code, errOut)
	}
}

// TestRLightningLive: serve --spec, validate and spec set take a
// rlightning config and serve, validate and store the spec it stands
// for.
func TestRLightningLive(t *testing.T) {
	colocate, _ := rlCase("cluster_openvla_8t8e_colocate")
	server, serveErr := startQuickServe(t, "--spec", colocate)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	// Served: 8 train, 8 eval, 1 buffer and the assumed env worker.
	runUntil(t, 30*time.Second, succeeds, "lookup", "env", "0", "--server", server)
	code, _, errOut := run(t, "lookup", "train", "7", "--server", server)
	if code != 0 {
		t.Fatalf("lookup train 7 of the served rlightning config: exit %d: %s", code, errOut)
	}
	// One env worker, rlightning's default, not examples/disaggregate.yaml's 32.
	if code, out, _ := run(t, "lookup", "env", "1", "--server", server); code == 0 {
		t.Errorf("lookup env 1 succeeded: the config stands for one env worker\n%s", out)
	}

	job, _ := rlCase("openpi_4t4e_libero_x4")
	code, out, errOut := run(t, "validate", "--spec", job, "--plan", "exp", "--server", server)
	if code != 0 || !strings.HasPrefix(out, "spec: rlightning job config "+job) || !strings.Contains(out, "workers: train 4, buffer 1, eval 4, env 4") {
		t.Errorf("validate of a job config: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	code, out, errOut = run(t, "spec", "set", "--plan", "exp", job, "--force", "--server", server)
	if code != 0 || !strings.Contains(out, "spec of plan exp stored") || !strings.Contains(out, "spec: rlightning job config") {
		t.Fatalf("spec set of a job config: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	nc, err := nats.Connect(server)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored, _, err := store.NewSpecStore(js).Get(ctx, "exp")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(job)
	src, _ := planner.ReadSpec(data)
	if string(stored) != string(src.Native) {
		t.Errorf("stored\n%s\nwant the translation\n%s", stored, src.Native)
	}
	natstest.WaitFor(t, 30*time.Second, "plan exp placed from the stored translation", func() bool {
		code, _, _ := run(t, "lookup", "env", "3", "--plan", "exp", "--server", server)
		return code == 0
	})
}
