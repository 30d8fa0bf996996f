package cli

import (
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"30d", 30 * 24 * time.Hour, ""},
		{"1d12h", 36 * time.Hour, ""},
		{"90s", 90 * time.Second, ""},
		{"720h", 720 * time.Hour, ""},
		{"0", 0, ""},
		{"-1d", -24 * time.Hour, ""},
		{"-5s", -5 * time.Second, ""},
		{"d", 0, "want a duration"},
		{"1.5d", 0, "whole number of days"},
		{"xd", 0, "whole number of days"},
		{"30", 0, "want a duration"},
		{"1d-5h", 0, "want a duration"},
		{"999999d", 0, "at most 36500"},
		{"0d", 0, ""},
		{"36500d2000000h", 0, "too long"},
	} {
		got, err := parseDuration(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, %v; want error %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}
