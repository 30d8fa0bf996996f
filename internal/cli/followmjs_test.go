package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// bigSpec places about 2,800 workers: over 2,048, so its first revision
// is a snapshot and a change after it a change event.
const bigSpec = `scheduling:
  train:  {worker_num: 200, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 200, num_cpus: 1, num_gpus: 1}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: %ENV%, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// nodeFollower is examples/js/follow.mjs, runnable: node and the npm
// packages (npm ci in examples/js). Without them the test skips, saying
// what is missing and how to run it, unless POOLPLANNER_REQUIRE_NODE is
// set (.ci/run sets it once npm ci worked): then it fails.
func nodeFollower(t *testing.T) string {
	t.Helper()
	script, _ := filepath.Abs("../../examples/js/follow.mjs")
	_, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "@nats-io", "jetstream"))
	}
	if err != nil {
		why := fmt.Sprintf("the JavaScript client examples/js/follow.mjs is NOT tested: %v; "+
			"install node (22 or later) and run `cd examples/js && npm ci` to test it", err)
		if os.Getenv("POOLPLANNER_REQUIRE_NODE") != "" {
			t.Fatalf("%s (POOLPLANNER_REQUIRE_NODE is set)", why)
		}
		t.Skipf("SKIPPED: %s (POOLPLANNER_REQUIRE_NODE=1 makes this a failure)", why)
	}
	return script
}

// TestFollowMJS: the JavaScript client, from subjects.md alone, rebuilds
// revisions from the plan stream and the snapshot object equal to what
// poolplanner.plan answers: a snapshot, a change on it, and, following,
// the next change as it is published.
func TestFollowMJS(t *testing.T) {
	script := nodeFollower(t)
	dir := t.TempDir()
	write := func(env string) string {
		p := filepath.Join(dir, "spec-"+env+".yaml")
		if err := os.WriteFile(p, []byte(strings.Replace(bigSpec, "%ENV%", env, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	url, serveErr := serveInProcess(t, "--spec", write("2400"), "--simulate", "140x8xH100", "--no-local-reporter", "--debounce", "50ms")
	nc := dialRetry(t, url)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	plan := func(rev int) map[string]any {
		t.Helper()
		var m map[string]any
		var err error
		waited := false
		defer func() { // also as WaitEvery fails the test
			if !waited {
				t.Logf("revision %d: %v\n%s", rev, err, serveErr)
			}
		}()
		// Every 100 ms: each try is a request to the planner.
		natstest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, fmt.Sprintf("a valid revision %d", rev), func() bool {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, rerr := c.RequestPlan(rctx, "default", rev)
			if err = rerr; err != nil || !d.Valid() {
				return false
			}
			b, _ := json.Marshal(d)
			_ = json.Unmarshal(b, &m)
			return true
		})
		waited = true
		return m
	}
	same := func(rev int, line []byte) {
		t.Helper()
		var got map[string]any
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("revision %d: follow.mjs printed no JSON: %v\n%.300s", rev, err, line)
		}
		want := plan(rev)
		for k := range want {
			if !reflect.DeepEqual(got[k], want[k]) {
				g, _ := json.Marshal(got[k])
				w, _ := json.Marshal(want[k])
				t.Errorf("revision %d: %s differs:\nfollow.mjs %.400s\nplanner    %.400s", rev, k, g, w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("revision %d: follow.mjs prints %s, the planner does not", rev, k)
			}
		}
	}
	node := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command("node", append([]string{script, "--server", url, "--plan", "default"}, args...)...)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("follow.mjs %v: %v\n%s", args, err, errOut.String())
		}
		return out
	}
	kinds := func() []string {
		var out []string
		_ = c.History(context.Background(), "default", func(i client.Info) bool {
			out = append(out, i.Kind)
			return true
		})
		return out
	}

	plan(1)
	if code, _, errOut := run(t, "spec", "set", "--server", url, write("2000")); code != 0 {
		t.Fatalf("spec set: %s", errOut)
	}
	plan(2)
	if k := kinds(); len(k) != 2 || k[0] != "snapshot" || k[1] != "change" {
		t.Fatalf("revisions stored as %v, want a snapshot and a change", k)
	}
	same(1, node("--revision", "1"))
	same(2, node("--revision", "2"))
	same(2, node()) // the latest

	// Following: the next revision is printed as it comes.
	fctx, fcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer fcancel()
	cmd := exec.CommandContext(fctx, "node", script, "--server", url, "--plan", "default", "--follow")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewReader(stdout)
	first, err := lines.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	same(2, first)
	if code, _, errOut := run(t, "spec", "set", "--server", url, write("2200")); code != 0 {
		t.Fatalf("spec set: %s", errOut)
	}
	next, err := lines.ReadBytes('\n')
	if err != nil {
		t.Fatalf("follow.mjs --follow printed no next revision: %v", err)
	}
	same(3, next)
}
