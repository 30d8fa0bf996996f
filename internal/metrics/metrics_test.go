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
