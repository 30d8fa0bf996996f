package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeBenchCluster writes the benchmark cluster (n nodes of 8
// GPUs; a quarter to train, a quarter to eval, the rest to env at 0.25) as
// an inventory file and a spec file.
func writeBenchCluster(tb testing.TB, dir string, n int) (inv, spec string) {
	var b strings.Builder
	b.WriteString(`{"node_id_to_resources": {`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"node-%05d": {"ip": "10.%d.%d.%d", "CPU": 256, "GPU": 8}`, i, i>>16, (i>>8)&255, i&255)
	}
	b.WriteString("}}")
	inv = filepath.Join(dir, "inventory.json")
	spec = filepath.Join(dir, "spec.yaml")
	g := 8 * n
	specText := fmt.Sprintf(`scheduling:
  train: {worker_num: %d, num_cpus: 1, num_gpus: 1}
  eval: {worker_num: %d, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: %d, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`, g/4, g/4, g/2*4)
	if err := os.WriteFile(inv, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(spec, []byte(specText), 0o644); err != nil {
		tb.Fatal(err)
	}
	return inv, spec
}

// BenchmarkPlanCommandYAML is `planner plan --output yaml` in-process,
// reading included, on the 20,000-node cluster.
func BenchmarkPlanCommandYAML(b *testing.B) {
	inv, spec := writeBenchCluster(b, b.TempDir(), 20000)
	for b.Loop() {
		if code := Main(context.Background(), []string{"plan", "--inventory", inv, "--spec", spec, "--output", "yaml"}, nil, io.Discard, io.Discard); code != 0 {
			b.Fatalf("exit %d", code)
		}
	}
}

// BenchmarkPlanCommandJSON is `planner plan --output json` in-process,
// reading included, on the 20,000-node cluster (about 100 MB of JSON).
func BenchmarkPlanCommandJSON(b *testing.B) {
	inv, spec := writeBenchCluster(b, b.TempDir(), 20000)
	for b.Loop() {
		if code := Main(context.Background(), []string{"plan", "--inventory", inv, "--spec", spec, "--output", "json"}, nil, io.Discard, io.Discard); code != 0 {
			b.Fatalf("exit %d", code)
		}
	}
}
