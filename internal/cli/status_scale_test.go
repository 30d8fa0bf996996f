package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// TestStatusAtScale: at 20,000 nodes and a plan of 351,563 workers,
// planner status reads the plan (no "unreadable", not INVALID, its row
// in the table) and tells a lease that does not expire in the past. It
// reads the plan's summary, not the whole plan: the snapshot that holds
// revision 1 whole is deleted first. A long test
// (POOLPLANNER_LONG_TESTS).
func TestStatusAtScale(t *testing.T) {
	if testing.Short() || os.Getenv("POOLPLANNER_LONG_TESTS") == "" {
		t.Skip("20,000 nodes: a long test; set POOLPLANNER_LONG_TESTS=1 (and no -short) to run it")
	}
	const n = 20000
	gpus := 8 * (n - n/16)
	spec := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(spec, fmt.Appendf(nil, `
scheduling:
  train:  {worker_num: %d, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: %d, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: %d, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`, gpus/4, gpus/16, gpus/2*4), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncWriter
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter",
			"--simulate", "10000x8xH100", "--simulate", "10000x8xH200", "--spec", spec, "--settle", "-1s"}, nil, &bytes.Buffer{}, &stderr)
	}()
	defer func() {
		cancel()
		<-done
	}()
	natstest.WaitEvery(t, 10*time.Minute, time.Second, "revision 1 published", func() bool {
		return strings.Contains(stderr.String(), `"revision":1,"valid":true`)
	})
	// Status lists the plan from its event and summary: with revision
	// 1's snapshot gone, the whole plan cannot be rebuilt, and a status
	// that rebuilt it would say "unreadable".
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	obs, err := js.ObjectStore(ctx, client.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Stored beside revision 1's assignments, after its event.
	natstest.WaitEvery(t, 2*time.Minute, 100*time.Millisecond, "revision 1's summary stored", func() bool {
		_, err := obs.GetInfo(ctx, wire.SummaryObject("default"))
		return err == nil
	})
	infos, err := obs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for _, info := range infos {
		if strings.HasPrefix(info.Name, wire.SnapshotPrefix("default")) {
			if err := obs.Delete(ctx, info.Name); err != nil {
				t.Fatal(err)
			}
			dropped++
		}
	}
	if dropped == 0 {
		t.Fatalf("no snapshot of plan default among %d objects: the test no longer tells a summary from a rebuild", len(infos))
	}
	t0 := time.Now()
	code, out, errOut := run(t, "status", "--server", "nats://"+addr)
	took := time.Since(t0)
	t.Logf("status took %v:\n%s", took, out[:min(len(out), 1500)])
	if code != 0 || strings.Contains(out, "unreadable") || strings.Contains(out, "INVALID") || strings.Contains(out, "expires in -") ||
		!strings.Contains(out, "plan default: revision 1, valid") || !regexp.MustCompile(`(?m)^default +0 +1 +150000 +351563 +valid$`).MatchString(out) {
		t.Fatalf("status exit %d:\n%s\n%s", code, out[:min(len(out), 3000)], errOut)
	}
}
