package cli

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), args, nil, &out, &errOut)
	return code, out.String(), errOut.String()
}

// runUntil runs the command until ok holds of its exit code and
// stdout, every 200 ms (each run connects anew), and returns its last
// stdout; after within it fails the test, logging the last run.
func runUntil(t *testing.T, within time.Duration, ok func(code int, out string) bool, args ...string) string {
	t.Helper()
	var code int
	var out, errOut string
	done := false
	defer func() { // also as WaitEvery fails the test
		if !done {
			t.Logf("%s: last exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
		}
	}()
	natstest.WaitEvery(t, within, 200*time.Millisecond, strings.Join(args, " ")+" as wanted", func() bool {
		code, out, errOut = run(t, args...)
		return ok(code, out)
	})
	done = true
	return out
}

// succeeds is runUntil's ok for a command that exits 0.
func succeeds(code int, _ string) bool { return code == 0 }

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const inv, spec = "testdata/cluster.json", "testdata/spec.yaml"

func TestPlanOutputs(t *testing.T) {
	code, out, errOut := run(t, "plan", "--inventory", inv, "--spec", spec, "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc planner.Plan
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json output: %v", err)
	}
	if !doc.Valid() || doc.Workers.Len() != 8+2+16+1 {
		t.Fatalf("valid=%v workers=%d", doc.Valid(), doc.Workers.Len())
	}
	for _, k := range []string{`"name"`, `"revision"`, `"created_at"`, `"reason"`, `"mode"`, `"strategy"`, `"env_strategy"`, `"valid"`, `"error"`, `"resource_pool"`, `"pools"`, `"workers"`, `"storage_to_train_workers"`, `"gpu_uuids"`, `"gpu_share"`, `"total_gpus"`, `"allocations"`} {
		if !strings.Contains(out, k) {
			t.Errorf("plan document lacks %s", k)
		}
	}

	code, out, _ = run(t, "plan", "--inventory", inv, "--spec", spec, "--output", "yaml")
	if code != 0 || !strings.HasPrefix(out, "resource_pool:\n") || !strings.Contains(out, `train: "0-7"`) {
		t.Fatalf("yaml output (exit %d):\n%s", code, out)
	}
	// The YAML export loads back in manual mode to the same plan.
	manual := writeFile(t, "manual.yaml", "scheduling:\n"+strings.SplitN(mustRead(t, spec), "scheduling:\n", 2)[1][:strings.Index(strings.SplitN(mustRead(t, spec), "scheduling:\n", 2)[1], "placement:")]+"placement: {mode: manual}\n"+out)
	code, out2, errOut := run(t, "plan", "--inventory", inv, "--spec", manual, "--output", "yaml")
	if code != 0 || out2 != out {
		t.Fatalf("round trip (exit %d, %s):\n%s\nwant\n%s", code, errOut, out2, out)
	}

	code, out, _ = run(t, "plan", "--inventory", inv, "--spec", spec)
	for _, want := range []string{"valid", "train_pool", "rollout_pool", "GPU map", "node-00", "TTTTTTTT"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("text output (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
}

func mustRead(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPlanInvalidExitsOne(t *testing.T) {
	big := writeFile(t, "big.yaml", "scheduling:\n  train: {worker_num: 100, num_cpus: 1, num_gpus: 1}\nplacement: {mode: auto, strategy: colocate}\n")
	code, out, _ := run(t, "plan", "--inventory", inv, "--spec", big, "--output", "json")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	var doc planner.Plan
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Valid() || !strings.Contains(doc.Error, "Insufficient GPUs: required 100.0, available 20") {
		t.Fatalf("doc valid=%v error=%q (%v)", doc.Valid(), doc.Error, err)
	}
}

func TestPlanBadInput(t *testing.T) {
	good := "placement: {mode: auto, strategy: disaggregate}\n"
	cases := []struct {
		name, spec, inv string
		args            []string
		want            string
	}{
		{name: "yaml syntax", spec: "scheduling: [\n", want: "not valid YAML or JSON"},
		{name: "json syntax", inv: `{"node_id_to_resources": {`, want: "not valid JSON"},
		{name: "misspelled strategy", spec: "scheduling: {}\nplacement: {strategy: disagregate}\n", want: "placement.strategy: disagregate is not allowed; want one of disaggregate, colocate"},
		{name: "unknown key", spec: "scheduling: {trian: {worker_num: 1}}\n" + good, want: `scheduling: unknown key "trian"`},
		{name: "negative count", spec: "scheduling: {eval: {worker_num: -2, num_gpus: 1}}\n" + good, want: "scheduling.eval.worker_num: -2 is not allowed"},
		{name: "fractional multi-gpu", spec: "scheduling: {eval: {worker_num: 1, num_gpus: 1.5}}\n" + good, want: "scheduling.eval.num_gpus: 1.5 is not allowed"},
		{name: "auto outside buffer", spec: "scheduling: {train: {worker_num: auto, num_gpus: 1}}\n" + good, want: `scheduling.train.worker_num: "auto" is allowed only for buffer`},
		{name: "malformed index", spec: "scheduling: {train: {worker_num: 1, num_gpus: 1}}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, train: \"0-x\"}]\n", want: `resource_pool[0].train: malformed index string "0-x"`},
		{name: "absurd CPUs", spec: "scheduling: {train: {worker_num: 8, num_cpus: 1e308, num_gpus: 1}}\n", want: "scheduling.train.num_cpus: 1e+308 is not allowed; want a number from 0 to 1000000000"},
		{name: "absurd node CPUs", inv: `{"node_id_to_resources": {"a": {"ip": "x", "CPU": 1e308, "GPU": 8}}}`, want: "node_id_to_resources.a.CPU: 1e+308 is not allowed; want a number from 0 to 1000000000"},
		{name: "null env group", spec: "scheduling: {env: [null]}\n", want: "scheduling.env[0]: want a mapping with worker_num, num_cpus and num_gpus, got nothing"},
		{name: "worker_counts per group", spec: "scheduling: {env: [{worker_num: 16, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, worker_counts: {env: [[16, 0]]}}]\n", want: "resource_pool[0].worker_counts.env[0]: gives 2 counts; want one per scheduling group of env (1)"},
		{name: "worker_counts of nothing", spec: "scheduling: {env: [{worker_num: 16, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, worker_counts: {env: [16], eval: [0]}}]\n", want: "resource_pool[0].worker_counts.eval: the spec schedules no eval workers"},
		{name: "worker_counts short", spec: "scheduling: {env: [{worker_num: 16, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, worker_counts: {env: [15]}}]\n", want: "resource_pool: worker_counts place 15 workers of scheduling.env[0]; it asks for 16"},
		{name: "worker_counts not a list", spec: "scheduling: {env: [{worker_num: 2, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, worker_counts: {env: 2}}]\n", want: "resource_pool[0].worker_counts.env: want a list with an entry per node, got the number 2"},
		{name: "worker_counts for buffer", spec: "scheduling: {env: [{worker_num: 2, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 1, num_gpus: 8, worker_counts: {buffer: [1]}}]\n", want: `resource_pool[0].worker_counts: unknown key "buffer"`},
		{name: "worker_counts too short", spec: "scheduling: {env: [{worker_num: 2, num_gpus: 0}]}\nplacement: {mode: manual}\nresource_pool: [{name: p, num_node: 2, num_gpus: 8, worker_counts: {env: [2]}}]\n", want: "resource_pool[0].worker_counts.env: lists 1 nodes but num_node is 2"},
		{name: "missing file", args: []string{"plan", "--inventory", "/nonexistent.json", "--spec", spec}, want: "--inventory: open /nonexistent.json"},
		{name: "unknown output", args: []string{"plan", "--inventory", inv, "--spec", spec, "--output", "xml"}, want: `--output: "xml" is not allowed; want text, json or yaml`},
		{name: "unknown flag", args: []string{"plan", "--inventroy", inv}, want: "unknown flag: --inventroy"},
		{name: "negative GPUs", inv: `{"node_id_to_resources": {"a": {"ip": "x", "CPU": 1, "GPU": -1}}}`, want: "node_id_to_resources.a.GPU: -1 is not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if args == nil {
				s, i := spec, inv
				if c.spec != "" {
					s = writeFile(t, "spec.yaml", c.spec)
				}
				if c.inv != "" {
					i = writeFile(t, "inv.json", c.inv)
				}
				args = []string{"plan", "--inventory", i, "--spec", s}
			}
			code, out, errOut := run(t, args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, errOut)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q, want one line containing %q", errOut, c.want)
			}
		})
	}
}

func TestPlanInfeasibleYAMLPrintsNothing(t *testing.T) {
	big := writeFile(t, "big.yaml", "scheduling:\n  train: {worker_num: 100, num_cpus: 1, num_gpus: 1}\n")
	code, out, errOut := run(t, "plan", "--inventory", inv, "--spec", big, "--output", "yaml")
	if code != 1 || out != "" || !strings.Contains(errOut, "Insufficient GPUs: required 100.0, available 20") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = run(t, "plan", "--inventory", inv, "--spec", big, "--output", "json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 1 {
		t.Fatalf("exit %d: %v", code, err)
	}
	for _, k := range []string{"workers", "pools", "resource_pool"} {
		if l, ok := doc[k].([]any); !ok || len(l) != 0 {
			t.Errorf("invalid plan's %s: %v, want an empty list", k, doc[k])
		}
	}
	if doc["moved"] != 0.0 || doc["demands"] == nil || doc["capacity"] == nil {
		t.Errorf("moved %v demands %v capacity %v", doc["moved"], doc["demands"], doc["capacity"])
	}
}

// TestPlanPrevious: --previous plans from a plan document, keeps what can
// stay and says what moved and why; a file that is no plan is bad input.
func TestPlanPrevious(t *testing.T) {
	_, prev, _ := run(t, "plan", "--inventory", inv, "--spec", spec, "--output", "json")
	prevFile := writeFile(t, "prev.json", prev)
	// node-01 leaves; node-03 joins with room for its workers.
	less := writeFile(t, "less.json", `{"node_id_to_resources": {
  "node-00": {"ip": "10.0.0.1", "CPU": 128, "GPU": 8},
  "node-02": {"ip": "10.0.0.3", "CPU": 64, "GPU": 4},
  "node-03": {"ip": "10.0.0.4", "CPU": 128, "GPU": 8}}}`)
	code, out, errOut := run(t, "plan", "--inventory", less, "--spec", spec, "--previous", prevFile, "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var before, after planner.Plan
	_ = json.Unmarshal([]byte(prev), &before)
	if err := json.Unmarshal([]byte(out), &after); err != nil || !after.Valid() {
		t.Fatalf("%v valid %v", err, after.Valid())
	}
	gone := 0
	for _, w := range before.Workers.All() {
		if w.NodeID == "node-01" {
			gone++
		} else if n := after.Workers.Find(w.Component, w.Index); n == nil || n.NodeID != w.NodeID {
			t.Errorf("%s %d moved off %s", w.Component, w.Index, w.NodeID)
		}
	}
	if after.Moved != gone || !strings.Contains(after.Reason, "dry run from the previous plan: re-placed") || !strings.Contains(after.Reason, "node left node-01") {
		t.Errorf("moved %d (node-01 had %d), reason %q", after.Moved, gone, after.Reason)
	}
	code, out, _ = run(t, "plan", "--inventory", less, "--spec", spec, "--previous", prevFile)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("moved %d workers; placed again: ", gone)) || !strings.Contains(out, "node left on node-01") {
		t.Errorf("text (exit %d):\n%s", code, out)
	}
	// As `nats req poolplanner.plan ... > plan.out` saves it: the body
	// (gzipped, as the service sends a large one) and a newline.
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte(prev))
	_ = zw.Close()
	for name, body := range map[string]string{"gzip and a newline": zipped.String() + "\n", "JSON and newlines": prev + "\n\n"} {
		if code, _, errOut := run(t, "plan", "--inventory", less, "--spec", spec, "--previous", writeFile(t, "p.out", body), "--output", "yaml"); code != 0 {
			t.Errorf("%s: exit %d %q", name, code, errOut)
		}
	}
	for _, c := range []struct{ name, body, want string }{
		{"not JSON", "scheduling: {}\n", "not a plan document (JSON object)"},
		{"an object's reference", `{"bucket":"poolplanner-replies","object":"reply-x","size":123}` + "\n", "nats object get poolplanner-replies reply-x"},
		{"gzip and more", zipped.String() + "junk", "more after the gzipped document"},
		{"not a plan", `{"node_id_to_resources": {}}`, `not a plan document: no "valid"`},
		{"bad workers", `{"valid": true, "pools": [], "workers": 3}`, "--previous"},
	} {
		code, out, errOut := run(t, "plan", "--inventory", less, "--spec", spec, "--previous", writeFile(t, "p.json", c.body))
		if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d stdout %q stderr %q", c.name, code, out, errOut)
		}
	}
	if code, _, errOut := run(t, "plan", "--inventory", less, "--spec", spec, "--previous", "/nonexistent.json"); code != 2 || !strings.Contains(errOut, "--previous: open /nonexistent.json") {
		t.Errorf("missing file: exit %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "plan", "--inventory", less, "--spec", spec, "--previous", ""); code != 2 || !strings.Contains(errOut, "--previous: give the plan document's file") {
		t.Errorf("empty --previous: exit %d %q", code, errOut)
	}
}

// TestInfeasibleJSON: planner plan --output json of a spec that cannot
// be placed exits 1 and prints the document as the README says: why,
// and no placement, its lists present and empty as on the bus.
func TestInfeasibleJSON(t *testing.T) {
	big := writeFile(t, "big.yaml", "scheduling: {train: {worker_num: 41, num_cpus: 1, num_gpus: 1}}\n")
	code, out, errOut := run(t, "plan", "--inventory", "../../examples/cluster-4x8gpu.json", "--spec", big, "--output", "json")
	var doc map[string]json.RawMessage
	if code != 1 || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	for key, want := range map[string]string{"valid": "false", "workers": "[]", "pools": "[]", "resource_pool": "[]", "storage_to_train_workers": "{}",
		"error": `"Insufficient GPUs: required 41.0, available 32"`} {
		if got := string(doc[key]); got != want {
			t.Errorf("%s: %s, want %s", key, got, want)
		}
	}
	for _, key := range []string{"demands", "capacity"} {
		if len(doc[key]) == 0 {
			t.Errorf("no %s", key)
		}
	}
}
