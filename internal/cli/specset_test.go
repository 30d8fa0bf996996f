package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// specRevisions is `planner spec ls --output json`: plan → spec revision.
func specRevisions(t *testing.T, server string) map[string]uint64 {
	t.Helper()
	code, out, errOut := run(t, "spec", "ls", "--output", "json", "--server", server)
	if code != 0 {
		t.Fatalf("spec ls: exit %d: %s", code, errOut)
	}
	var ls []specListing
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("spec ls: %v\n%s", err, out)
	}
	revs := map[string]uint64{}
	for _, l := range ls {
		revs[l.Plan] = l.SpecRevision
	}
	return revs
}

// TestSpecSetValidates: spec set stores a spec that can be placed now,
// refuses one that cannot (exit 1, validate's reason, nothing stored),
// stores it with --force and says so, and refuses a spec with an error
// of its own (exit 2) forced or not.
func TestSpecSetValidates(t *testing.T) {
	server, serveErr := startQuickServe(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server) // the first plan
	before := specRevisions(t, server)["default"]

	// Feasible as default's spec (its own GPUs not in its way).
	code, out, errOut := run(t, "spec", "set", "--plan", "default", "../../examples/vllm-tp4.yaml", "--server", server)
	if code != 0 || !strings.Contains(out, "spec of plan default stored") || errOut != "" {
		t.Fatalf("spec set vllm-tp4: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	stored := specRevisions(t, server)["default"]
	if stored <= before {
		t.Fatalf("spec revision %d after spec set, was %d", stored, before)
	}

	// 40 GPUs of 32: refused, with validate's reason; nothing stored.
	big := writeFile(t, "big.yaml", "scheduling: {train: {worker_num: 40, num_cpus: 1, num_gpus: 1}}\n")
	code, out, errOut = run(t, "spec", "set", "--plan", "default", big, "--server", server)
	if code != 1 || out != "" || !strings.Contains(errOut, "spec of plan default not stored: it cannot be placed now: Insufficient GPUs: required 40.0, available 32") ||
		!strings.Contains(errOut, "--force") {
		t.Errorf("spec set of 40 GPUs: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// Two million workers of nothing: more than 4 nodes may hold,
	// refused naming the field (planner.MaxNodeWorkers).
	many := writeFile(t, "many.yaml", "scheduling: {train: {worker_num: 2000000, num_gpus: 0, num_cpus: 0}}\n")
	code, out, errOut = run(t, "spec", "set", "--plan", "default", many, "--server", server)
	if code != 1 || out != "" || !strings.Contains(errOut, "spec of plan default not stored: it cannot be placed now: scheduling.train.worker_num: 2000000 workers in all, more than this cluster can hold: 4 nodes at most 1024 workers each, 4096 in all") {
		t.Errorf("spec set of two million workers: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// The reasons come under "why", as validate gives them.
	huge := writeFile(t, "huge.yaml", "scheduling: {eval: {worker_num: 1, num_cpus: 0, num_gpus: 16}}\n")
	code, _, errOut = run(t, "spec", "set", "--plan", "default", huge, "--server", server)
	if code != 1 || !strings.Contains(errOut, "spec of plan default not stored: it cannot be placed now") ||
		!strings.Contains(errOut, "why\n  eval: 0 of 1 placed\n    excluded: fewer than 16 healthy GPUs on") {
		t.Errorf("spec set of a 16-GPU worker: exit %d\nstderr %s", code, errOut)
	}
	// A new plan likewise.
	code, _, errOut = run(t, "spec", "set", "--plan", "exp", big, "--server", server)
	if code != 1 || !strings.Contains(errOut, "spec of plan exp not stored: it cannot be placed now: it cannot fit this cluster at all, whatever other plans hold: Insufficient GPUs: required 40.0") {
		t.Errorf("spec set of 40 GPUs as plan exp: exit %d\nstderr %s", code, errOut)
	}
	// A spec with an error of its own: exit 2, forced or not.
	bad := writeFile(t, "bad.yaml", "scheduling: {train: {worker_num: 4, num_cpus: 1, num_gpus: 1}}\nplacement: {strategy: disagregate}\n")
	for _, force := range []bool{false, true} {
		args := []string{"spec", "set", "--plan", "default", bad, "--server", server}
		if force {
			args = append(args, "--force")
		}
		if code, _, errOut = run(t, args...); code != 2 || !strings.Contains(errOut, "placement.strategy: disagregate is not allowed") {
			t.Errorf("spec set of a bad spec (force %v): exit %d, stderr %s", force, code, errOut)
		}
	}
	revs := specRevisions(t, server)
	if revs["default"] != stored {
		t.Errorf("spec revision %d after refusals, want %d: something was stored", revs["default"], stored)
	}
	if _, ok := revs["exp"]; ok {
		t.Errorf("plan exp has a spec after a refusal: %v", revs)
	}

	// Forced: stored, and stderr says it cannot be placed now.
	code, out, errOut = run(t, "spec", "set", "--plan", "default", big, "--force", "--server", server)
	if code != 0 || !strings.Contains(out, "spec of plan default stored") ||
		!strings.Contains(errOut, "warning: plan default: stored (--force), but it cannot be placed now: Insufficient GPUs: required 40.0, available 32") {
		t.Errorf("spec set --force of 40 GPUs: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if got := specRevisions(t, server)["default"]; got <= stored {
		t.Errorf("spec revision %d after spec set --force, was %d", got, stored)
	}
}

// TestSpecSetWithoutPlanner: with no planner to validate, spec set says
// so and stores nothing, unless --force.
func TestSpecSetWithoutPlanner(t *testing.T) {
	server := natstest.Start(t).URL()

	code, out, errOut := run(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--wait", "300ms", "--server", server)
	if code != 1 || out != "" || !strings.Contains(errOut, "spec of plan exp not stored: no planner answers poolplanner.validate to validate it, waited 300ms") {
		t.Errorf("spec set without a planner: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// Nothing stored, not even the bucket: spec ls finds no state.
	if code, _, errOut := run(t, "spec", "ls", "--server", server); code != 1 || !strings.Contains(errOut, "no poolplanner state") {
		t.Errorf("spec ls after a refusal: exit %d: %s", code, errOut)
	}
	code, out, errOut = run(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--force", "--wait", "0", "--server", server)
	if code != 0 || !strings.Contains(out, "spec of plan exp stored") || !strings.Contains(errOut, "stored without validation (--force): no planner answers poolplanner.validate") {
		t.Errorf("spec set --force without a planner: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if revs := specRevisions(t, server); revs["exp"] == 0 {
		t.Errorf("no spec of plan exp after spec set --force: %v", revs)
	}
	if code, _, errOut := run(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--wait", "-1s", "--server", server); code != 2 || !strings.Contains(errOut, "--wait") {
		t.Errorf("--wait -1s: exit %d: %s", code, errOut)
	}
}

// TestSpecSetWaitsForPlanner: spec set sent while no planner serves yet
// (planner serve just started) waits for one to answer, and stores the
// spec it validates.
func TestSpecSetWaitsForPlanner(t *testing.T) {
	srv := natstest.Start(t)
	type result struct {
		code        int
		out, errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := run(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--wait", "2m", "--server", srv.URL())
		done <- result{code, out, errOut}
	}()
	// Its first request has gone unanswered: no planner yet.
	natstest.WaitFor(t, 30*time.Second, "spec set's first validate request", func() bool {
		v, err := srv.NATS().Varz(nil)
		return err == nil && v.InMsgs > 0
	})
	runServe(t, "--server", srv.URL(), "--simulate", "4x8xH100", "--no-local-reporter", "--settle", "-1s")
	select {
	case r := <-done:
		if r.code != 0 || !strings.Contains(r.out, "spec of plan exp stored") || r.errOut != "" {
			t.Fatalf("spec set: exit %d\nstdout %s\nstderr %s", r.code, r.out, r.errOut)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("spec set did not end")
	}
}

// TestSpecSetQuotaItsOwn: beside the quick start's plan (24 of 32
// GPUs), a spec over its own max_gpus is refused for its quota alone,
// by validate and spec set both, never put down to plan default.
func TestSpecSetQuotaItsOwn(t *testing.T) {
	server, serveErr := startQuickServe(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server)
	q := writeFile(t, "q.yaml", "scheduling: {train: {worker_num: 8, num_cpus: 1, num_gpus: 1}}\nmax_gpus: 4\n")
	const want = "max_gpus: the plan needs 8 GPUs; its quota is 4"
	for _, args := range [][]string{
		{"validate", "--plan", "q", "--spec", q},
		{"spec", "set", "--plan", "q", q},
	} {
		code, out, errOut := run(t, append(args, "--server", server)...)
		if code != 1 || !strings.Contains(out+errOut, want) || strings.Contains(out+errOut, "default (priority") {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, errOut)
		}
	}
}
