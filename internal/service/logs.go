package service

import "time"

// The planner's log lines follow two rules: a line about one plan names
// it once (planState.log carries "plan"; the loop's own logger, whose
// lines are about every plan, carries none), and a duration is a string
// with its unit (dur), never zerolog's bare number of milliseconds.

// dur is d as a log field: Go's notation with its unit, rounded to the
// millisecond ("92ms", "1.5s", "2m0s"); below a millisecond, as it is
// ("250µs").
func dur(d time.Duration) string {
	if d >= time.Millisecond || d <= -time.Millisecond {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}
