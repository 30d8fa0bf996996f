package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestServeSimulatedNoDrops: `serve --simulate 10000x8xH100 --simulate
// 10000x8xH200` starts its 20,000 reporters in turn, so the server drops
// none of their requests: every node's first put is stored and the
// embedded server's dropped requests
// (poolplanner_nats_requests_dropped_total, from its advisories) stay
// at 0. A long test (POOLPLANNER_LONG_TESTS).
func TestServeSimulatedNoDrops(t *testing.T) {
	if testing.Short() || os.Getenv("POOLPLANNER_LONG_TESTS") == "" {
		t.Skip("20,000 simulated reporters: a long test; set POOLPLANNER_LONG_TESTS=1 (and no -short) to run it")
	}
	serveSimulated(t, 20000, "10000x8xH100", "10000x8xH200")
}

// TestServeSimulatedCounted: a small simulation the same way, which
// checks the dropped-requests counter is served at 0 (what the long test
// relies on) in every run.
func TestServeSimulatedCounted(t *testing.T) {
	serveSimulated(t, 8, "8x8xH100")
}

// serveSimulated runs serve with the simulations given (nodes of them in
// all) and checks that every reporter's first put is stored and the
// server dropped none of their requests. A put that timed out (its
// server slow, say a CI machine's CPUs busy with other packages' tests)
// and was retried is no drop: the reporters' failures are logged, not
// failed on.
func serveSimulated(t *testing.T, nodes int, sims ...string) {
	addr, maddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncWriter
	done := make(chan int, 1)
	args := []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter", "--metrics-listen", maddr,
		"--spec", "../../examples/disaggregate.yaml", "--settle", "-1s"}
	for _, s := range sims {
		args = append(args, "--simulate", s)
	}
	go func() { done <- Main(ctx, args, nil, &bytes.Buffer{}, &stderr) }()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	}()
	var text string
	natstest.WaitEvery(t, 5*time.Minute, time.Second, "every simulated node's first put stored", func() bool {
		text = scrapeQuiet("http://" + maddr + "/metrics")
		return metricValue(text, `poolplanner_reporter_puts_total{kind="change"}`) >= float64(nodes)
	})
	const dropped = "poolplanner_nats_requests_dropped_total"
	if !regexp.MustCompile(`(?m)^` + dropped + ` `).MatchString(text) {
		t.Fatalf("%s not served:\n%s", dropped, text)
	}
	if v := metricValue(text, dropped); v != 0 {
		t.Errorf("the server dropped %v requests:\n%s", v, firstLines(stderr.String(), "dropping", 5))
	}
	if s := stderr.String(); strings.Contains(s, "dropping") || strings.Contains(s, "queue limit") {
		t.Errorf("the server logged dropped requests:\n%s", firstLines(s, "dropping", 5))
	}
	var failed []string
	for _, m := range regexp.MustCompile(`(?m)^poolplanner_reporter_errors_total(\{[^}]*\}) (\S+)$`).FindAllStringSubmatch(text, -1) {
		if v, _ := strconv.ParseFloat(m[2], 64); v != 0 {
			failed = append(failed, m[1]+" "+m[2])
		}
	}
	if len(failed) > 0 {
		t.Logf("the reporters retried (no request dropped): %v\n%s", failed, firstLines(stderr.String(), "retrying", 10))
	}
}

// firstLines is the first n lines of s that hold what.
func firstLines(s, what string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, what) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// scrapeQuiet reads url's metrics, "" while it cannot.
func scrapeQuiet(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}
