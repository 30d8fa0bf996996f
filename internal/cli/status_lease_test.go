package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// TestStatusLeaseAsRead: the lease's expiry is told as of when it was
// read, however long the other reads took before the report is written
// (at 20,000 nodes, seconds: a lease renewed meanwhile was told expired,
// "expires in -7.2s"); a report with no read time tells it as of now.
func TestStatusLeaseAsRead(t *testing.T) {
	renewed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name      string
		read, now time.Time
		want      string
	}{
		{"read at once, written 8 s later", renewed.Add(time.Second), renewed.Add(9 * time.Second), "lease expires in 4s unless renewed"},
		{"no read time", time.Time{}, renewed.Add(2 * time.Second), "lease expires in 3s unless renewed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			at := renewed
			r := &statusReport{Plan: "default", Leader: &bus.Lease{Holder: "p1", Host: "h", PID: 7, Since: renewed, Renewed: renewed, TTLSeconds: 5}, leaseRead: c.read}
			r.At = &at
			var b strings.Builder
			if err := r.write(&b, c.now); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), c.want) {
				t.Fatalf("report\n%s\nwants %q", b.String(), c.want)
			}
		})
	}
}
