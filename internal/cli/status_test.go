package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/testcluster"
)

// TestStatusInOutage: on three servers with the state replicated, a
// server gone is shown offline within a few heartbeats; with two of
// three gone (no quorum), status still answers in a few seconds, saying
// that the leader and the streams are unavailable and giving the
// plan's latest revision from the planner itself, and history gives
// that revision with a word that the rest is not there.
func TestStatusInOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	c := testcluster.Start(t, 3, nil)
	serveErr, _ := runServe(t, "--server", c.URLs(), "--replicas", "3", "--spec", "../../examples/disaggregate.yaml",
		"--simulate", "4x8xH100", "--no-local-reporter", "--debounce", "50ms", "--settle", "-1s")
	status := func() (string, time.Duration) {
		start := time.Now()
		code, out, errOut := run(t, "status", "--server", c.URL(0))
		if code != 0 {
			t.Fatalf("status: exit %d: %s\n%s", code, errOut, serveErr)
		}
		return out, time.Since(start)
	}
	waitForOut := func(what string, cond func(string) bool) string {
		t.Helper()
		var out string
		waited := false
		defer func() { // also as WaitEvery fails the test
			if !waited {
				t.Logf("the last status:\n%s\n%s", out, c.State())
			}
		}()
		// Every 200 ms: status is a new connection each time.
		natstest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "status showing "+what, func() bool {
			out, _ = status()
			return cond(out)
		})
		waited = true
		return out
	}
	// status exits 1 until the planner made its streams.
	runUntil(t, 60*time.Second, succeeds, "status", "--server", c.URL(0))
	waitForOut("a valid plan and a leader", func(out string) bool {
		return strings.Contains(out, "plan default: revision 1, valid") && strings.Contains(out, "leader: planner")
	})

	c.StopServer(2)
	waitForOut("server s2 offline", func(out string) bool {
		return strings.Contains(out, "s2 (OFFLINE")
	})

	c.StopServer(1)
	// The stream leaders notice the lost quorum within seconds.
	waitForOut("the lost quorum", func(out string) bool { return strings.Contains(out, "leader: UNKNOWN") })
	out, took := status()
	// Depending on timing the plan stream's replica still answers reads
	// (no leader: "no quorum"), or nothing does (then the revision comes
	// from the planner); either way it says so.
	for _, want := range []string{"plan default: revision 1, valid", "leader: UNKNOWN", "unavailable: stream POOLPLANNER_PLANS"} {
		if !strings.Contains(out, want) {
			t.Errorf("status without a quorum lacks %q:\n%s", want, out)
		}
	}
	t.Logf("status without a quorum answered in %s", took.Round(time.Millisecond))
	code, hist, errOut := run(t, "history", "--server", c.URL(0))
	// From the stream's replica, or (unreadable) the planner's latest
	// revision with a word on stderr.
	if code != 0 || !strings.Contains(hist, "\n1 ") {
		t.Errorf("history without a quorum: exit %d\n%s\n%s", code, hist, errOut)
	}
}

// TestServeOnModestServers: three servers with 1 GiB of file storage
// each (a modest max_file_store) take serve --replicas 3: nothing
// reserves more than they have.
func TestServeOnModestServers(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	c := testcluster.StartLimited(t, 3, nil, 1<<30)
	serveErr, done := runServe(t, "--server", c.URLs(), "--replicas", "3", "--spec", "../../examples/disaggregate.yaml",
		"--simulate", "4x8xH100", "--no-local-reporter", "--debounce", "50ms", "--settle", "-1s")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr)
		}
	})
	runUntil(t, 60*time.Second, func(code int, out string) bool {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d", code)
		default:
		}
		return code == 0 && strings.Contains(out, "sim-h100-")
	}, "lookup", "train", "0", "--server", c.URL(0))
}
