package client

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/plan"
)

// TestInfoState: a history reads a revision's state from its headers;
// an event from before states reads as valid or invalid by its valid.
func TestInfoState(t *testing.T) {
	for _, c := range []struct {
		valid, state string
		want         plan.State
	}{
		{"true", "", plan.StateValid},
		{"false", "", plan.StateInvalid},
		{"false", "degraded", plan.StateDegraded},
		{"false", "invalid", plan.StateInvalid},
		{"true", "degraded", plan.StateValid}, // valid says all
	} {
		h := nats.Header{}
		h.Set(ValidHeader, c.valid)
		if c.state != "" {
			h.Set(StateHeader, c.state)
		}
		if got := infoOf(1, time.Time{}, h).State; got != c.want {
			t.Errorf("valid %s, state %q: %q, want %q", c.valid, c.state, got, c.want)
		}
	}
}

// TestInfoMeta: a history's entry carries the event's place and headers
// in the one metadata type a revision has.
func TestInfoMeta(t *testing.T) {
	for _, c := range []struct {
		name string
		h    map[string]string
		want Meta
	}{
		{"all headers", map[string]string{BaseHeader: "3", SpecDigestHeader: "d1", PlacedForHeader: "d0", SpecRevisionHeader: "12", PlannerHeader: "p1"},
			Meta{Seq: 7, Base: 3, SpecDigest: "d1", PlacedFor: "d0", SpecRevision: 12, Publisher: "p1"}},
		{"spec revision unreadable", map[string]string{SpecRevisionHeader: "-1"}, Meta{Seq: 7}},
		{"none", nil, Meta{Seq: 7}},
		{"base unreadable", map[string]string{BaseHeader: "x"}, Meta{Seq: 7}},
	} {
		h := nats.Header{}
		for k, v := range c.h {
			h.Set(k, v)
		}
		if got := infoOf(7, time.Time{}, h).Meta; got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
