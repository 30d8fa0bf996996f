package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// scraped is a registry's samples, by name{label="...",...} (labels in
// order of name; histograms by their count).
func scraped(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			var labels []string
			for _, l := range m.GetLabel() { // in order of name
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// waitScraped waits until reg's samples satisfy ok, and returns them.
func waitScraped(t *testing.T, reg *prometheus.Registry, what string, ok func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	var got map[string]float64
	natstest.WaitFor(t, 15*time.Second, "metrics "+what, func() bool {
		got = scraped(t, reg)
		return ok(got)
	})
	return got
}

// planGauges are the gauges a plan's latest revision sets.
var planGauges = []string{"poolplanner_plan_revision", "poolplanner_plan_valid", "poolplanner_plan_workers", "poolplanner_plan_gpus",
	"poolplanner_plan_priority", "poolplanner_plan_preempted"}

// wantGauges are plan p's gauges as its revision says.
func wantGauges(p *planner.Plan) map[string]float64 {
	valid := 0.0
	if p.Valid() {
		valid = 1
	}
	preempted := 0.0
	if len(p.PreemptedBy) > 0 {
		preempted = 1
	}
	v := []float64{float64(p.Revision), valid, float64(p.Workers.Len()), planner.HeldShares(p), float64(p.Priority), preempted}
	out := map[string]float64{}
	for i, g := range planGauges {
		out[fmt.Sprintf("%s{plan=%q}", g, p.Name)] = v[i]
	}
	return out
}

// TestGaugesAtStart: a planner restarted on plans it did not publish
// has every plan's gauges from its latest revision before any new
// revision (its replans wait an hour here), and the leader gauge of
// every plan; a standby has them too, its leader gauges 0.
func TestGaugesAtStart(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	h.cluster(4, map[string]string{"default": shareSpec(8, 0), "exp": shareSpec(4, 2)})
	stop := h.plannerWith(ctx, Config{Debounce: 50 * time.Millisecond, Settle: -1})
	valid := func(p *planner.Plan) bool { return p.Valid() }
	plans := []*planner.Plan{h.waitFor("default", "valid", valid), h.waitFor("exp", "valid", valid)}
	stop()

	want := map[string]float64{}
	for _, p := range plans {
		for k, v := range wantGauges(p) {
			want[k] = v
		}
	}
	leaders := func(v float64) func(map[string]float64) bool {
		return func(got map[string]float64) bool {
			for _, p := range plans {
				if got[fmt.Sprintf("poolplanner_plan_leader{plan=%q}", p.Name)] != v || got[fmt.Sprintf("poolplanner_plan_revision{plan=%q}", p.Name)] == 0 {
					return false
				}
			}
			return true
		}
	}
	check := func(who string, got map[string]float64) {
		t.Helper()
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: %s = %v (present %v), want %v", who, k, g, ok, v)
			}
		}
	}
	slow := Config{Debounce: time.Hour, Settle: -1}
	lead := prometheus.NewRegistry()
	slow.Metrics = metrics.NewPlanner(lead)
	defer h.plannerWith(ctx, slow)()
	check("restarted leader", waitScraped(t, lead, "leading both plans", leaders(1)))
	standby := prometheus.NewRegistry()
	slow.Metrics = metrics.NewPlanner(standby)
	defer h.plannerWith(ctx, slow)()
	check("standby", waitScraped(t, standby, "standing by for both plans", leaders(0)))
	for _, p := range plans {
		if latest := h.waitFor(p.Name, "any", func(*planner.Plan) bool { return true }); latest.Revision != p.Revision {
			t.Errorf("plan %s published revision %d: the gauges may be its", p.Name, latest.Revision)
		}
	}
}

// TestRemovedPlanSeriesEnd: a removed plan's series all end, its replan
// time and leader gauge included, and no later replan brings one back.
func TestRemovedPlanSeriesEnd(t *testing.T) {
	t.Parallel()
	h := newMemHarness(t)
	ctx := context.Background()
	specs := h.cluster(2, map[string]string{"default": shareSpec(4, 0), "big": shareSpec(8, 5)})
	reg := prometheus.NewRegistry()
	defer h.plannerWith(ctx, Config{Debounce: 20 * time.Millisecond, Settle: -1, Metrics: metrics.NewPlanner(reg)})()
	valid := func(p *planner.Plan) bool { return p.Valid() }
	h.waitFor("big", "valid", valid)
	h.waitFor("default", "valid", valid)
	waitScraped(t, reg, "with big's replans and leader", func(got map[string]float64) bool {
		return got[`poolplanner_replan_duration_seconds{plan="big"}`] > 0 && got[`poolplanner_plan_leader{plan="big"}`] == 1
	})
	if err := specs.Delete(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	h.waitFor("big", "removed", func(p *planner.Plan) bool { return p.Removed() })
	// A replan after the one that removed it: the loop measured that one
	// by then.
	before := h.waitFor("default", "any", func(*planner.Plan) bool { return true }).Revision
	if _, err := specs.Put(ctx, "default", []byte(shareSpec(3, 0))); err != nil {
		t.Fatal(err)
	}
	h.waitFor("default", "a new revision", func(p *planner.Plan) bool { return p.Revision > before })
	got := waitScraped(t, reg, "with default's replan counted", func(got map[string]float64) bool {
		return got[`poolplanner_plan_workers{plan="default"}`] == 3
	})
	for k := range got {
		if strings.Contains(k, `plan="big"`) {
			t.Errorf("a removed plan's series remains: %s", k)
		}
	}
}

// TestStepDownClearsLeaderGauge: the leaser stepping down says so in
// the leader gauge at once, not when the loop (maybe stuck) reads the
// event; Health says leading only while the loop leads on the lease
// held.
func TestStepDownClearsLeaderGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := drive(New(Config{Metrics: metrics.NewPlanner(reg), Log: zerolog.Nop()}))
	s := p.addState("default")
	s.spec = &planner.Spec{}
	p.publishSnapshot(true)
	ls := newLeaser(p.Service, zerolog.Nop())
	gauge := `poolplanner_plan_leader{plan="default"}`
	p.fence.set(5, 1)
	p.led.Store(1)
	p.leaderGauges()
	if got := scraped(t, reg)[gauge]; got != 1 || !p.Health().Leading {
		t.Fatalf("leading: gauge %v, health leading %v", got, p.Health().Leading)
	}
	ls.stepDown("test")
	if got := scraped(t, reg)[gauge]; got != 0 {
		t.Errorf("stepped down, the loop not told yet: leader gauge %v, want 0", got)
	}
	if p.Health().Leading {
		t.Error("stepped down: health says leading")
	}
	p.fence.set(7, 3) // taken again, the loop not caught up
	if p.Health().Leading {
		t.Error("health says leading on a lease the loop has not caught up on")
	}
}

// TestStepDownAfterRemovalKeepsSeriesEnded: a plan removed, its series
// ended, while the snapshot still lists it; the leaser then steps down:
// no leader gauge of the removed plan begins again.
func TestStepDownAfterRemovalKeepsSeriesEnded(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := drive(New(Config{Metrics: metrics.NewPlanner(reg), Log: zerolog.Nop()}))
	for _, name := range []string{"default", "gone"} {
		p.addState(name).spec = &planner.Spec{}
	}
	p.publishSnapshot(true)
	ls := newLeaser(p.Service, zerolog.Nop())
	p.fence.set(5, 1)
	p.led.Store(1)
	p.leaderGauges()
	p.drop(p.states["gone"]) // the snapshot still lists it
	ls.stepDown("test")
	got := scraped(t, reg)
	if v, ok := got[`poolplanner_plan_leader{plan="gone"}`]; ok {
		t.Errorf("the removed plan's leader gauge begins again: %v", v)
	}
	if v, ok := got[`poolplanner_plan_leader{plan="default"}`]; !ok || v != 0 {
		t.Errorf("default's leader gauge after stepping down: %v (present %v), want 0", v, ok)
	}
}
