package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// durationValue is a time.Duration flag that also takes days, which Go's
// durations do not: "30d", "1d12h", "-1d". Credentials that last a month
// and history kept for a week are said in days.
type durationValue time.Duration

// durationVar defines a duration flag that takes days too.
func durationVar(f *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	f.Var((*durationValue)(p), name, usage)
}

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

// String is "0" for none, which flag help leaves out as a zero default.
func (d *durationValue) String() string {
	if *d == 0 {
		return "0"
	}
	const day = 24 * time.Hour
	if v := time.Duration(*d); v%day == 0 {
		return fmt.Sprintf("%dd", v/day)
	}
	return time.Duration(*d).String()
}

func (d *durationValue) Type() string { return "duration" }

// parseDuration reads a Go duration, with an optional leading count of
// days: 30d, 1d12h, 90m.
func parseDuration(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	rest := strings.TrimPrefix(s, "-")
	var days int64
	if i := strings.IndexByte(rest, 'd'); i > 0 {
		n, err := strconv.ParseInt(rest[:i], 10, 64)
		if err != nil || n > 100*365 {
			return 0, fmt.Errorf("duration %q: want a whole number of days (at most 36500) before d, as in 30d or 1d12h", s)
		}
		days, rest = n, rest[i+1:]
	}
	var d time.Duration
	if rest != "" {
		var err error
		if d, err = time.ParseDuration(rest); err != nil || d < 0 {
			return 0, fmt.Errorf("duration %q: want a duration such as 90s, 12h, 30d or 1d12h", s)
		}
	} else if !strings.Contains(s, "d") {
		return 0, fmt.Errorf("duration %q: want a duration such as 90s, 12h, 30d or 1d12h", s)
	}
	const day = 24 * time.Hour
	if d > math.MaxInt64-time.Duration(days)*day {
		return 0, fmt.Errorf("duration %q: too long; at most about 290 years", s)
	}
	d += time.Duration(days) * day
	if neg {
		d = -d
	}
	return d, nil
}
