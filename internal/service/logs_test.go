package service

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestDur: durations in log lines carry their unit, rounded to the
// millisecond.
func TestDur(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		92349994 * time.Nanosecond: "92ms",
		1500 * time.Millisecond:    "1.5s",
		90 * time.Second:           "1m30s",
		250 * time.Microsecond:     "250µs",
		0:                          "0s",
	} {
		if got := dur(d); got != want {
			t.Errorf("dur(%v) = %q, want %q", d, got, want)
		}
	}
}

// keysOnce fails on a JSON log line that has a key twice.
func keysOnce(t *testing.T, line string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s", line)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		key := tok.(string)
		if seen[key] {
			t.Errorf("key %q twice: %s", key, line)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
	}
}

// TestLogLinesNamePlanOnce: with several plans (specs loaded, one that
// does not parse, one removed, revisions published), no JSON log line
// of the planner has a key twice ("plan" above all).
func TestLogLinesNamePlanOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"default": shareSpec(4, 0), "exp": shareSpec(2, 1)})
	kv, err := specs.(*store.SpecStore).KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "bad", []byte("scheduling: [not, a, mapping]")); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	p := New(Config{NC: h.nc, JS: h.js, Debounce: 20 * time.Millisecond, Settle: -1, NoService: true, Log: zerolog.New(&logs)})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() { cancel(); <-done }()
	h.waitFor("exp", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if err := specs.Delete(ctx, "exp"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("exp", "removed", func(p *planner.Plan) bool { return p.Removed() })
	h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() })
	lines, plans := 0, 0
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		lines++
		keysOnce(t, sc.Text())
		if strings.Contains(sc.Text(), `"plan":`) {
			plans++
		}
	}
	if plans < 4 {
		t.Errorf("%d of %d lines name a plan; want the specs loaded and the revisions published:\n%s", plans, lines, logs.String())
	}
}

// TestRemovedLongAgo: a spec removal the planner reads at start is
// released only where the plan's last revision still holds workers; a
// plan whose last revision says it was removed has nothing to release:
// no state is kept for it, and nothing is said.
func TestRemovedLongAgo(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"old": shareSpec(2, 0), "held": shareSpec(2, 0)})
	stop := h.plannerWith(ctx, Config{Debounce: 20 * time.Millisecond, Settle: -1})
	h.waitFor("held", "valid", func(p *planner.Plan) bool { return p.Valid() })
	h.waitFor("old", "valid", func(p *planner.Plan) bool { return p.Valid() })
	if err := specs.Delete(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("old", "removed", func(p *planner.Plan) bool { return p.Removed() })
	stop()
	if err := specs.Delete(ctx, "held"); err != nil { // while no planner runs
		t.Fatal(err)
	}

	var logs syncBuffer
	p := drive(New(Config{NC: h.nc, JS: h.js, NoService: true, Log: zerolog.New(&logs)}))
	if _, err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l, err := p.newLoop(lctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	for _, name := range []string{"old", "held", "default"} {
		l.removed(lctx, p.state(name), name, 0, l.log.With().Str("plan", name).Logger())
	}
	if s := p.state("old"); s != nil {
		t.Errorf("a plan removed long ago has a state again (removing %v)", s.removing)
	}
	if s := p.state("held"); s == nil || !s.removing {
		t.Errorf("a plan removed while no planner ran, its workers still held: state %v, not to be released", s)
	}
	if got := logs.String(); strings.Count(got, "spec removed") != 1 || !strings.Contains(got, `"plan":"held"`) {
		t.Errorf("want one line, the held plan's release:\n%s", got)
	}
}

// TestPredecessor: whose lease a starting planner takes for its own
// predecessor's, and when it may take it over at once.
func TestPredecessor(t *testing.T) {
	t.Parallel()
	now := time.Now()
	stale, fresh := now.Add(-10*time.Second), now
	dead := func(int) bool { return false }
	alive := func(int) bool { return true }
	for _, c := range []struct {
		what      string
		lease     bus.Lease
		before    string
		alive     func(int) bool
		own, gone bool
	}{
		{"this host, a pid gone, not renewed since", bus.Lease{Holder: "a", Host: "h", PID: 7, Renewed: stale, TTLSeconds: 5}, "", dead, true, true},
		{"this host, a pid gone, renewed just now (another machine of that name?)", bus.Lease{Holder: "a", Host: "h", PID: 7, Renewed: fresh, TTLSeconds: 5}, "", dead, true, false},
		{"this host, a pid running", bus.Lease{Holder: "a", Host: "h", PID: 7, Renewed: stale, TTLSeconds: 5}, "", alive, false, false},
		{"this host, this pid (a container's pid 1)", bus.Lease{Holder: "a", Host: "h", PID: 1, Renewed: stale, TTLSeconds: 5}, "", alive, true, false},
		{"named in the state file", bus.Lease{Holder: "a", Host: "other", PID: 7, Renewed: stale, TTLSeconds: 5}, "a", alive, true, false},
		{"another host", bus.Lease{Holder: "a", Host: "other", PID: 7, Renewed: stale, TTLSeconds: 5}, "b", dead, false, false},
		{"no host said", bus.Lease{Holder: "a", PID: 7, Renewed: stale, TTLSeconds: 5}, "", dead, false, false},
	} {
		own, gone := predecessor(&c.lease, "h", 1, c.before, c.alive, now)
		if own != c.own || gone != c.gone {
			t.Errorf("%s: own %v gone %v, want %v %v", c.what, own, gone, c.own, c.gone)
		}
	}
}

// TestMarksNameInstance: the state file names the planner that runs on
// it, and the next one reads it as its predecessor.
func TestMarksNameInstance(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "revisions.json")
	k := newMarks(path)
	if err := k.load(); err != nil || k.predecessor() != "" {
		t.Fatalf("a new file: predecessor %q, %v", k.predecessor(), err)
	}
	if err := k.claim("first"); err != nil {
		t.Fatal(err)
	}
	if err := k.raise("default", 3); err != nil {
		t.Fatal(err)
	}
	next := newMarks(path)
	if err := next.load(); err != nil || next.predecessor() != "first" || next.get("default") != 3 {
		t.Fatalf("read back: predecessor %q, mark %d, %v", next.predecessor(), next.get("default"), err)
	}
}

// TestDeadPredecessorLeaseTakenOver: a planner killed without giving
// its lease back (kill -9) left it on this host, its process gone; the
// planner started after it takes the lease over at once rather than
// standing by for another planner (the lease here lasts an hour).
func TestDeadPredecessorLeaseTakenOver(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	h.node("n1")
	plans := store.NewPlanStore(h.js)
	if err := plans.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	// Renewed long before: an hour's lease renewed every 20 minutes.
	left := time.Now().Add(-2 * time.Hour)
	if _, err := plans.WriteLease(ctx, bus.LeaseName, &bus.Lease{Holder: "killed", Host: host, PID: deadPID(t), Since: left, Renewed: left,
		TTLSeconds: time.Hour.Seconds()}, 0); err != nil {
		t.Fatal(err)
	}
	defer h.planner(ctx, shareSpec(4, 0))()
	if p := h.waitFor("default", "valid", func(p *planner.Plan) bool { return p.Valid() }); p.Revision != 1 {
		t.Fatalf("revision %d", p.Revision)
	}
	if l, err := plans.ReadLease(ctx, bus.LeaseName); err != nil || l == nil || l.Holder == "killed" {
		t.Fatalf("the lease: %+v, %v", l, err)
	}
}

// deadPID is the pid of a process of this host that ran and ended.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
