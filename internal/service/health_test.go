package service

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// healthDoc is node id's 8 simulated GPUs with GPU 3 healthy or not.
func healthDoc(t *testing.T, id string, healthy bool) inventory.NodeInventory {
	t.Helper()
	var sick []int
	if !healthy {
		sick = []int{3}
	}
	var doc inventory.NodeInventory
	if err := json.Unmarshal(simDoc(id, sick...), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestProbationAndFlapping, on the service's clock: a GPU that turns
// healthy again stays out for the probation, then gets work; one that
// turned unhealthy FlapCount times within FlapWindow is held out (a
// drain of cause flapping) past any probation, until it is undrained;
// turns spread over more than the window hold nothing out.
func TestProbationAndFlapping(t *testing.T) {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := New(Config{Clock: c, Probation: 10 * time.Minute, Log: zerolog.Nop()})
	p.drainsRead(map[string]store.Drain{})
	report := func(healthy bool) {
		t.Helper()
		p.apply(store.Event{Op: store.Changed, NodeID: "n1", Inventory: healthDoc(t, "n1", healthy)})
		p.refreshOut()
	}
	tick := func(d time.Duration) {
		c.advance(d)
		select {
		case <-p.drain.timer.C():
			p.drain.at = time.Time{}
		default:
		}
		p.refreshOut()
	}
	drained := func() []int { return p.live.nodes["n1"].Drained }
	causes := func() []string {
		var out []string
		for _, d := range p.drainViews() {
			out = append(out, d.Cause)
		}
		return out
	}
	steps := []struct {
		what    string
		do      func()
		drained []int
		causes  []string
	}{
		{"healthy at first", func() { report(true) }, nil, nil},
		{"unhealthy (1)", func() { report(false) }, nil, nil},
		{"healthy again: on probation", func() { report(true) }, []int{3}, []string{plan.DrainProbation}},
		{"probation nearly over", func() { tick(9 * time.Minute) }, []int{3}, []string{plan.DrainProbation}},
		{"probation over", func() { tick(time.Minute) }, nil, nil},
		{"unhealthy (2)", func() { report(false) }, nil, nil},
		{"healthy again", func() { tick(time.Minute); report(true) }, []int{3}, []string{plan.DrainProbation}},
		{"unhealthy (3) within the hour: held out", func() { report(false) }, []int{3}, []string{plan.DrainFlapping}},
		{"healthy again: still held out", func() { report(true) }, []int{3}, []string{plan.DrainFlapping}},
		{"hours later: still held out", func() { tick(5 * time.Hour) }, []int{3}, []string{plan.DrainFlapping}},
		{"undrained", func() { p.drainsRead(map[string]store.Drain{}) }, nil, nil},
		{"unhealthy again after the undrain (1)", func() { report(false) }, nil, nil},
		{"over more than the window", func() {
			for range 3 {
				tick(31 * time.Minute)
				report(true)
				tick(31 * time.Minute)
				report(false)
			}
			report(true)
			tick(11 * time.Minute)
		}, nil, nil},
	}
	for _, s := range steps {
		s.do()
		if got := drained(); !slices.Equal(got, s.drained) {
			t.Errorf("%s: drained GPUs %v, want %v", s.what, got, s.drained)
		}
		if got := causes(); !slices.Equal(got, s.causes) {
			t.Errorf("%s: out for %v, want %v", s.what, got, s.causes)
		}
	}
	if got := p.drain.byKey[store.DrainKey("n1", new(3))]; got.Cause != "" {
		t.Errorf("after the undrain the hold-out stays: %+v", got)
	}
}
