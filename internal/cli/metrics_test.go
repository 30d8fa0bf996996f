package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// scrape reads url's metrics and fails on lint problems.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	return string(body)
}

// metricValue is the value of the sample whose line starts with name
// (labels included), -1 if none.
func metricValue(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// planSeries are the series of one plan, by name.
var planSeries = []string{"poolplanner_plan_revision", "poolplanner_plan_valid", "poolplanner_plan_workers", "poolplanner_plan_gpus",
	"poolplanner_plan_priority", "poolplanner_plan_preempted", "poolplanner_plan_leader"}

// TestMetrics: serve --metrics-listen serves lint-clean metrics that
// follow the plan: revision, validity, workers moved, replans, the
// inventory, requests; a spec change makes a new revision they show; a
// removed plan's series all end; restarted on its data, the planner
// shows every plan's gauges before any new revision.
func TestMetrics(t *testing.T) {
	addr, maddr, data := freeAddr(t), freeAddr(t), t.TempDir()
	url := "nats://" + addr
	murl := "http://" + maddr + "/metrics"
	serve := func(extra ...string) func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- Main(ctx, append([]string{"serve", "--listen", addr, "--data-dir", data, "--no-local-reporter", "--metrics-listen", maddr,
				"--simulate", "4x8xH100", "--spec", "../../examples/disaggregate.yaml", "--settle", "-1s", "--log-level", "error"}, extra...), nil, &bytes.Buffer{}, &bytes.Buffer{})
		}()
		return func() {
			cancel()
			<-done
			// The metrics listener closes a moment after serve returns.
			natstest.WaitFor(t, 10*time.Second, "the metrics listener closed after serve returned", func() bool {
				resp, err := http.Get(murl)
				if err == nil {
					resp.Body.Close()
				}
				return err != nil
			})
		}
	}
	stop := serve()
	defer func() { stop() }()
	wait := func(name string, want float64) string {
		t.Helper()
		var text string
		natstest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, fmt.Sprintf("%s at %v", name, want), func() bool {
			resp, err := http.Get(murl)
			if err != nil {
				return false
			}
			resp.Body.Close()
			text = scrape(t, murl)
			return metricValue(text, name) == want
		})
		return text
	}
	text := wait(`poolplanner_plan_revision{plan="default"}`, 1)
	// The gauges of one replan are set one after another (the revision's
	// as it is published, the inventory's after): each is waited for.
	for name, want := range map[string]float64{`poolplanner_plan_valid{plan="default"}`: 1, `poolplanner_plan_leader{plan="default"}`: 1,
		`poolplanner_inventory_nodes`: 4, `poolplanner_inventory_unhealthy_gpus`: 0, `poolplanner_plan_gpus{plan="default"}`: 24} {
		text = wait(name, want)
	}
	moved := metricValue(text, `poolplanner_plan_workers_moved_total{plan="default"}`)
	if code, _, errOut := run(t, "lookup", "train", "0", "--server", url); code != 0 {
		t.Fatal(errOut)
	}
	if code, _, errOut := run(t, "lookup", "nope", "0", "--server", url); code == 0 {
		t.Fatal("a bad lookup answered", errOut)
	}
	if code, _, errOut := run(t, "spec", "set", "../../examples/vllm-tp4.yaml", "--server", url); code != 0 {
		t.Fatal(errOut)
	}
	text = wait(`poolplanner_plan_revision{plan="default"}`, 2)
	if got := metricValue(text, `poolplanner_plan_workers_moved_total{plan="default"}`); got <= moved {
		t.Errorf("workers moved %v after a revision that moved some, was %v", got, moved)
	}
	// A replan is counted once it is over, after its revision is out.
	natstest.WaitFor(t, 10*time.Second, "2 replans counted", func() bool {
		text = scrape(t, murl)
		return metricValue(text, `poolplanner_replan_duration_seconds_count{plan="default"}`) >= 2
	})
	for _, want := range []string{`poolplanner_requests_total{code="200",endpoint="lookup"} 1`, `poolplanner_requests_total{code="400",endpoint="lookup"} 1`,
		`poolplanner_reporter_puts_total{kind="change"} 4`, "\npoolplanner_gpus_unplanned_use 0\n", "\npoolplanner_planner_stood_down 0\n", "\npoolplanner_loop_stuck 0\n", "\npoolplanner_replan_failures 0\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s in:\n%s", want, grep(text, "poolplanner_requests_total|poolplanner_reporter"))
		}
	}

	// A plan of higher priority: default gives way, and says so; removed,
	// its series end.
	big := writeFile(t, "big.yaml", "priority: 10\nscheduling: {train: {worker_num: 8, num_cpus: 1, num_gpus: 1}}\n")
	if code, _, errOut := run(t, "spec", "set", "--plan", "big", big, "--server", url); code != 0 {
		t.Fatal(errOut)
	}
	wait(`poolplanner_plan_preempted{plan="default"}`, 1)
	wait(`poolplanner_plan_priority{plan="big"}`, 10) // published after default gave way
	text = scrape(t, murl)
	replans := metricValue(text, `poolplanner_replan_duration_seconds_count{plan="default"}`)
	if code, _, errOut := run(t, "spec", "rm", "--plan", "big", "--server", url); code != 0 {
		t.Fatal(errOut)
	}
	wait(`poolplanner_plan_priority{plan="big"}`, -1)
	// Once the replan that removed it is counted (default's), no series
	// of big remains, nor comes back.
	natstest.WaitFor(t, 10*time.Second, "the replan that removed big counted", func() bool {
		text = scrape(t, murl)
		return metricValue(text, `poolplanner_replan_duration_seconds_count{plan="default"}`) > replans
	})
	if got := grep(text, `plan="big"`); got != "" {
		t.Errorf("series of a removed plan remain:\n%s", got)
	}

	// A second plan, then a restart on the same data: before any new
	// revision (its replans wait an hour), every plan's gauges are back,
	// and whether this planner leads each.
	small := writeFile(t, "small.yaml", "scheduling: {train: {worker_num: 2, num_cpus: 1, num_gpus: 1}}\n")
	// (--force: exp may not fit beside default; its revision counts either way.)
	if code, _, errOut := run(t, "spec", "set", "--force", "--plan", "exp", small, "--server", url); code != 0 {
		t.Fatal(errOut)
	}
	text = wait(`poolplanner_plan_revision{plan="exp"}`, 1)
	// A plan's gauges are set one after another: a scrape may fall
	// between its revision's and its workers'.
	before := map[string]float64{}
	missing := ""
	defer func() {
		if missing != "" {
			t.Logf("the series missing last: %s", missing)
		}
	}()
	natstest.WaitFor(t, 10*time.Second, "every series of both plans", func() bool {
		text, missing = scrape(t, murl), ""
		for _, plan := range []string{"default", "exp"} {
			for _, name := range planSeries {
				series := fmt.Sprintf("%s{plan=%q}", name, plan)
				if before[series] = metricValue(text, series); before[series] < 0 {
					missing = series
				}
			}
		}
		return missing == ""
	})
	stop()
	stop = serve("--debounce", "1h")
	text = wait(`poolplanner_plan_leader{plan="exp"}`, 1)
	for series, want := range before {
		if got := metricValue(text, series); got != want {
			t.Errorf("after the restart %s = %v, want %v as before", series, got, want)
		}
	}
}

func grep(text, pattern string) string {
	re := regexp.MustCompile(pattern)
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return fmt.Sprint(strings.Join(out, "\n"))
}
