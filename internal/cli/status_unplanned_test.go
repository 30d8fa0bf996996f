package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/internal/inventory"
)

// TestStatusBoundsUnplanned: status's text lists a rogue document's
// unplanned use bounded (the first GPUs, each with its first processes,
// and how many more), not every process of every GPU.
func TestStatusBoundsUnplanned(t *testing.T) {
	procs := make([]inventory.Process, inventory.MaxProcesses)
	for i := range procs {
		procs[i] = inventory.Process{PID: uint32(i + 1), Name: strings.Repeat("p", inventory.MaxString)}
	}
	for _, c := range []struct {
		gpus      int
		more      string
		wantLines int
	}{
		{1, "", 2},
		{32, "", 33},
		{33, "and 1 more GPUs", 34},
		{200, "and 168 more GPUs", 34},
	} {
		t.Run(fmt.Sprint(c.gpus), func(t *testing.T) {
			r := &statusReport{}
			for i := range c.gpus {
				r.Unplanned = append(r.Unplanned, inventory.UnplannedGPU{NodeID: fmt.Sprintf("rogue%d", i/64), Index: i % 64, UUID: fmt.Sprintf("GPU-%d", i), Processes: procs})
			}
			var b bytes.Buffer
			r.writeUnplanned(&b)
			out := b.String()
			if lines := strings.Count(out, "\n"); lines != c.wantLines {
				t.Errorf("%d lines, want %d:\n%.500s", lines, c.wantLines, out)
			}
			if c.more != "" && !strings.Contains(out, c.more) {
				t.Errorf("no %q:\n%.500s", c.more, out)
			}
			if !strings.HasPrefix(out, fmt.Sprintf("UNPLANNED USE: %d GPUs", c.gpus)) {
				t.Errorf("header: %.100s", out)
			}
			// Each line: the first processes, names clipped: about 1 KB.
			if per := len(out) / c.wantLines; per > 1500 {
				t.Errorf("%d bytes a line", per)
			}
		})
	}
}
