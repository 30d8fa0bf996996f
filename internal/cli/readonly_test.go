package cli

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestReadOnlyOnBareServer: the read-only commands against a NATS
// server where no planner ever ran exit non-zero, saying there is no
// poolplanner state there, and create nothing; so do drain and undrain,
// saying the planner makes the drain bucket. drain --list on a server
// whose planner predates drains (its other state there, no drain
// bucket) finds nothing drained, and makes no bucket either.
func TestReadOnlyOnBareServer(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	cases := [][]string{
		{"history"},
		{"history", "--plan", "nope"},
		{"spec", "ls"},
		{"spec", "get", "--plan", "default"},
		{"spec", "rm", "--plan", "default"},
		{"status"},
		{"status", "-o", "json"},
		{"drain", "--list"},
		{"drain", "--list", "-o", "json"},
	}
	for _, args := range cases {
		code, out, errOut := run(t, append(args, "--server", srv.URL())...)
		if code == 0 || !strings.Contains(errOut, "no poolplanner state on this server") {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, errOut)
		}
	}
	for _, args := range [][]string{{"drain", "n1"}, {"drain", "n1:3", "--reason", "r"}, {"undrain", "n1"}} {
		code, out, errOut := run(t, append(args, "--server", srv.URL())...)
		if code != 1 || out != "" || !strings.Contains(errOut, "the drain bucket "+client.DrainBucket+" does not exist") ||
			!strings.Contains(errOut, "planner serve makes it at start") {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, errOut)
		}
	}
	js := srv.JS(t)
	names := js.StreamNames(context.Background())
	var made []string
	for n := range names.Name() {
		made = append(made, n)
	}
	if len(made) > 0 {
		t.Errorf("read-only commands made streams: %v", made)
	}

	if err := store.NewPlanStore(js).Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ output, want string }{{"text", "nothing drained\n"}, {"json", "[]\n"}} {
		code, out, errOut := run(t, "drain", "--list", "-o", c.output, "--server", srv.URL())
		if code != 0 || out != c.want {
			t.Errorf("drain --list -o %s without a drain bucket: exit %d\nstdout %q\nstderr %s", c.output, code, out, errOut)
		}
	}
	if _, err := js.Stream(context.Background(), "KV_"+client.DrainBucket); err == nil {
		t.Error("drain --list made the drain bucket")
	}
}

// TestSpecGetAndMissingPlans: spec get prints the stored spec as stored
// or as JSON; a plan that does not exist is an error for spec get,
// history and status --plan; spec ls shows a spec that does not parse
// on a line of its own, not in a column.
func TestSpecGetAndMissingPlans(t *testing.T) {
	server, serveErr := startQuickServe(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server)
	file, err := os.ReadFile("../../examples/disaggregate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "spec", "get", "--plan", "default", "--server", server)
	if code != 0 || out != string(file) || !strings.Contains(errOut, "plan default: spec revision 1, stored ") {
		t.Fatalf("spec get: exit %d\nstdout %q\nstderr %s", code, out, errOut)
	}
	code, out, errOut = run(t, "spec", "get", "--plan", "default", "-o", "json", "--server", server)
	want, _ := specJSON(file)
	var got, wantV any
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || json.Unmarshal(want, &wantV) != nil || !jsonEqual(got, wantV) {
		t.Fatalf("spec get -o json: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, _, errOut = run(t, "spec", "get", "-o", "toml", "--server", server); code != 2 || !strings.Contains(errOut, "want yaml or json") {
		t.Errorf("spec get -o toml: exit %d: %s", code, errOut)
	}
	for _, args := range [][]string{
		{"spec", "get", "--plan", "nope"},
		{"history", "--plan", "nope"},
		{"status", "--plan", "nope"},
	} {
		code, out, errOut := run(t, append(args, "--server", server)...)
		if code != 1 || !strings.Contains(errOut, "nope") || out != "" {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, errOut)
		}
	}

	// A spec written around the planner commands that does not parse.
	nc := dialRetry(t, server)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), client.SpecBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "broken", []byte("scheduling: [")); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "spec", "ls", "--server", server)
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "broken ") {
			row = l
		}
	}
	if code != 0 || !strings.Contains(row, " ?  ") || strings.Contains(row, "parse") ||
		!strings.Contains(out, "plan broken: its stored spec (spec revision 2) DOES NOT PARSE: ") {
		t.Errorf("spec ls: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, out, _ := run(t, "spec", "get", "--plan", "broken", "--server", server); code != 0 || out != "scheduling: [" {
		t.Errorf("spec get of a spec that does not parse, as stored: exit %d: %q", code, out)
	}
	if code, _, errOut := run(t, "spec", "get", "--plan", "broken", "-o", "json", "--server", server); code != 1 || !strings.Contains(errOut, "does not parse") {
		t.Errorf("spec get -o json of a spec that does not parse: exit %d: %s", code, errOut)
	}
}

// jsonEqual compares two decoded JSON values.
func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
