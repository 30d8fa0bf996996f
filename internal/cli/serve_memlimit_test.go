package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestServeMemoryLimitFlag: a --memory-limit that is no size is refused
// at once, with exit 2 and the flag named.
func TestServeMemoryLimitFlag(t *testing.T) {
	for _, bad := range []string{"lots", "-1Gi", "0", "1.5Qi", "0x10"} {
		args := []string{"serve", "--no-local-reporter", "--memory-limit", bad}
		code, _, errOut := run(t, args...)
		if want := `--memory-limit "` + bad + `": want a size`; code != ExitUsage || !strings.Contains(errOut, want) {
			t.Errorf("planner %s: exit %d, %q; want exit %d and %q", strings.Join(args, " "), code, errOut, ExitUsage, want)
		}
	}
}

// TestSetMemoryLimit: the size --memory-limit reads is the runtime's
// limit, in bytes.
func TestSetMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want int64
	}{
		{"450Mi", 450 << 20},
		{"2G", 2 << 30},
		{"123456789", 123456789},
	} {
		n, err := parseBytes(tc.flag)
		if err != nil {
			t.Fatalf("parseBytes(%q): %v", tc.flag, err)
		}
		before := setMemoryLimit(n)
		got := debug.SetMemoryLimit(before)
		if got != tc.want {
			t.Errorf("--memory-limit %s: the runtime's limit was %d, want %d", tc.flag, got, tc.want)
		}
	}
}
