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
		valid, state, want string
	}{
		{"true", "", plan.StateValid},
		{"false", "", plan.StateInvalid},
		{"false", plan.StateDegraded, plan.StateDegraded},
		{"false", plan.StateInvalid, plan.StateInvalid},
		{"true", plan.StateDegraded, plan.StateValid}, // valid says all
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
