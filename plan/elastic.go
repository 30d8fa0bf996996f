package plan

import (
	"fmt"
	"strings"
)

// Why a valid plan's elastic groups changed size (Status.Reason).
const (
	// ReasonShrunk: it gave up elastic workers (the highest indices) so
	// that the plans By could be placed (itself: to re-place its own
	// fixed workers after a loss).
	ReasonShrunk Reason = "shrunk"
	// ReasonGrew: it grew elastic workers (the next indices) into GPUs
	// no plan needed.
	ReasonGrew Reason = "grew"
)

// Resize is one elastic group's change of size in a revision.
type Resize struct {
	Component Component `json:"component"`
	// Group is the scheduling.env entry (0 for eval).
	Group int `json:"group,omitempty"`
	From  int `json:"from"`
	To    int `json:"to"`
}

// Name is the group as a spec names it: "eval", "env", or "env[2]" for
// a later env entry.
func (r Resize) Name() string {
	if r.Component == Env && r.Group > 0 {
		return fmt.Sprintf("env[%d]", r.Group)
	}
	return string(r.Component)
}

// ResizeWords says what Resized did to plan self, for a revision's
// reason: "grew eval 4 -> 24", "shrank eval 24 -> 12 for plan b",
// "shrank eval 12 -> 4 to re-place its own workers"; empty when nothing
// was resized.
func (s Status) ResizeWords(self string) string {
	var others []string
	own := false
	for _, b := range s.By {
		if b == self {
			own = true
		} else {
			others = append(others, b)
		}
	}
	var parts []string
	for _, r := range s.Resized {
		verb := "grew"
		if r.To < r.From {
			verb = "shrank"
		}
		w := fmt.Sprintf("%s %s %d -> %d", verb, r.Name(), r.From, r.To)
		if r.To < r.From {
			if len(others) > 0 {
				w += " for plan " + strings.Join(others, ", plan ")
			}
			if own {
				w += " to re-place its own workers"
			}
		}
		parts = append(parts, w)
	}
	return strings.Join(parts, "; ")
}
