package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// series counts the series per plan label in reg.
func series(t *testing.T, reg *prometheus.Registry) map[string][]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "plan" {
					out[l.GetValue()] = append(out[l.GetValue()], mf.GetName())
				}
			}
		}
	}
	return out
}

// TestRemovedEndsEverySeries: a removed plan leaves no series at all
// (gauges, leader, counters, histograms); the other plan's stay.
func TestRemovedEndsEverySeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewPlanner(reg)
	for _, plan := range []string{"gone", "kept"} {
		m.Published(plan, 3, true, 8, 7.5, 2)
		m.Shared(plan, 5, false)
		m.Leading(plan, true)
		m.Replanned(plan, 10*time.Millisecond, 20*time.Millisecond)
	}
	before := series(t, reg)
	if len(before["gone"]) != 10 || len(before["kept"]) != 10 {
		t.Fatalf("series before removal: %v", before)
	}
	m.Removed("gone")
	after := series(t, reg)
	if len(after["gone"]) != 0 {
		t.Errorf("a removed plan's series remain: %v", after["gone"])
	}
	if len(after["kept"]) != len(before["kept"]) {
		t.Errorf("the other plan's series: %v, were %v", after["kept"], before["kept"])
	}
}

// TestInventoryFaults: rejections, resyncs and claim decisions are
// counted by their kind's label alone; the conflicts gauge is set; a
// nil *Planner records nothing and does not panic.
func TestInventoryFaults(t *testing.T) {
	var none *Planner
	none.Rejected("invalid")
	none.Resynced("reconnect")
	none.StartRetried("forming")
	none.Claimed(1, 1)
	none.Inventory(1, 1, 1)

	reg := prometheus.NewRegistry()
	m := NewPlanner(reg)
	m.Rejected("invalid")
	m.Rejected("invalid")
	m.Rejected("key_mismatch")
	m.Resynced("reconnect")
	m.StartRetried("forming")
	m.StartRetried("forming")
	m.StartRetried("unavailable")
	m.Claimed(2, 0)
	m.Claimed(1, 3)
	m.Claimed(0, 0)
	m.Inventory(4, 3, 2)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range s.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[key] = s.GetCounter().GetValue() + s.GetGauge().GetValue()
		}
	}
	for _, c := range []struct {
		key  string
		want float64
	}{
		{"poolplanner_inventory_rejected_total{reason=invalid}", 2},
		{"poolplanner_inventory_rejected_total{reason=key_mismatch}", 1},
		{"poolplanner_inventory_resyncs_total{why=reconnect}", 1},
		{"poolplanner_start_retries_total{cause=forming}", 2},
		{"poolplanner_start_retries_total{cause=unavailable}", 1},
		{"poolplanner_gpu_uuid_claims_total{outcome=refused}", 3},
		{"poolplanner_gpu_uuid_claims_total{outcome=handover}", 3},
		{"poolplanner_gpu_uuid_conflicts", 2},
		{"poolplanner_inventory_unhealthy_gpus", 3},
	} {
		if v, ok := got[c.key]; !ok || v != c.want {
			t.Errorf("%s = %v (present %v), want %v", c.key, v, ok, c.want)
		}
	}
	if _, ok := got["poolplanner_inventory_rejected_total{reason=unparsable}"]; ok {
		t.Errorf("a series for a reason never seen: %v", got)
	}
}
