package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSeveralPlansCommands: spec set, ls and rm of several plans on one
// serve, and status printing them with their GPUs and nodes.
func TestSeveralPlansCommands(t *testing.T) {
	server, serveErr := startQuickServe(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	// status -o json until the plans are as want says.
	status := func(want func(map[string]statusPlan) bool) map[string]statusPlan {
		t.Helper()
		var by map[string]statusPlan
		runUntil(t, 30*time.Second, func(code int, out string) bool {
			if code != 0 {
				return false
			}
			var r struct {
				Plans []statusPlan `json:"plans"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			by = map[string]statusPlan{}
			for _, p := range r.Plans {
				by[p.Name] = p
			}
			return want(by)
		}, "status", "-o", "json", "--server", server)
		return by
	}
	status(func(m map[string]statusPlan) bool { return m["default"].Valid })

	if code, out, errOut := run(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--server", server); code != 0 {
		t.Fatalf("spec set exp: %d %s %s", code, out, errOut)
	}
	m := status(func(m map[string]statusPlan) bool { return m["exp"].Valid })
	if m["default"].GPUsHeld != 24 || m["exp"].GPUsHeld != 8 {
		t.Fatalf("GPUs held: %+v", m)
	}
	code, out, _ := run(t, "spec", "ls", "--server", server)
	if code != 0 || !strings.Contains(out, "exp ") || !strings.Contains(out, "default ") || !strings.Contains(out, " 8 ") {
		t.Fatalf("spec ls: %d\n%s", code, out)
	}

	// train-big (priority 10) takes 16: default gives way, exp stays.
	if code, _, errOut := run(t, "spec", "set", "--plan", "train-big", "../../examples/train-big.yaml", "--server", server); code != 0 {
		t.Fatalf("spec set train-big: %s", errOut)
	}
	m = status(func(m map[string]statusPlan) bool { return m["train-big"].Valid && !m["default"].Valid })
	if !strings.HasPrefix(m["default"].Error, "preempted by plan train-big (priority 10)") || !m["exp"].Valid {
		t.Fatalf("after train-big: %+v", m)
	}
	code, out, _ = run(t, "status", "--server", server)
	for _, want := range []string{"PLAN", "train-big  10", "INVALID: preempted by plan train-big", "GPUS HELD BY", "train-big 8"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("status text lacks %q:\n%s", want, out)
		}
	}

	// Removing: a usage error without --plan, an error for no such plan,
	// then train-big's workers released and default back.
	if code, _, errOut := run(t, "spec", "rm", "--server", server); code != 2 || !strings.Contains(errOut, "--plan") {
		t.Fatalf("spec rm without --plan: %d %s", code, errOut)
	}
	if code, _, errOut := run(t, "spec", "rm", "--plan", "nope", "--server", server); code != 1 || !strings.Contains(errOut, "plan nope has no spec") {
		t.Fatalf("spec rm nope: %d %s", code, errOut)
	}
	if code, _, errOut := run(t, "spec", "rm", "--plan", "train-big", "--server", server); code != 0 {
		t.Fatalf("spec rm train-big: %s", errOut)
	}
	m = status(func(m map[string]statusPlan) bool { _, big := m["train-big"]; return !big && m["default"].Valid })
	if !m["exp"].Valid {
		t.Fatalf("after rm: %+v", m)
	}
}

type statusPlan struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Valid    bool   `json:"valid"`
	GPUsHeld int    `json:"gpus_held"`
	Error    string `json:"error"`
}
