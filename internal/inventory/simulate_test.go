package inventory

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestParseSimulation(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "8xH100", want: "8xH100"},
		{in: "4xA100", want: "4xA100"},
		{in: "8xh200", want: "8xH200"},
		{in: " 2XL4 ", want: "2xL4"},
		{in: "1xA100-40GB", want: "1xA100-40GB"},
		{in: "0xH100", wantErr: "GPU count must be 1 to 64"},
		{in: "65xH100", wantErr: "GPU count must be 1 to 64"},
		{in: "99999999999999999999xH100", wantErr: "GPU count"},
		{in: "8xV100", wantErr: `unknown GPU model "V100"`},
		{in: "H100", wantErr: "want NxMODEL"},
		{in: "8x", wantErr: "want NxMODEL"},
		{in: "", wantErr: "want NxMODEL"},
		{in: "-1xH100", wantErr: "want NxMODEL"},
	}
	for _, tt := range tests {
		got, err := ParseSimulation(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSimulation(%q) error = %v, want containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSimulation(%q): %v", tt.in, err)
			continue
		}
		if got.String() != tt.want {
			t.Errorf("ParseSimulation(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// Any string either parses into something that prints back to itself
// (up to case) or fails with an error; it never panics.
func TestParseSimulationProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.OneOf(
			rapid.String(),
			rapid.Custom(func(t *rapid.T) string {
				n := rapid.IntRange(-5, 100).Draw(t, "n")
				m := rapid.SampledFrom([]string{"H100", "h200", "A100", "B200", "nope", ""}).Draw(t, "model")
				x := rapid.SampledFrom([]string{"x", "X", "*", ""}).Draw(t, "x")
				return fmt.Sprintf("%d%s%s", n, x, m)
			}),
		).Draw(t, "spec")
		sim, err := ParseSimulation(s)
		if err != nil {
			return
		}
		if sim.Count < 1 || sim.Count > MaxSimulatedGPUs {
			t.Fatalf("ParseSimulation(%q) count %d out of range", s, sim.Count)
		}
		again, err := ParseSimulation(sim.String())
		if err != nil || again != sim {
			t.Fatalf("round trip of %q: got %v, %v; want %v", s, again, err, sim)
		}
	})
}

func FuzzParseSimulation(f *testing.F) {
	for _, s := range []string{"8xH100", "4xa100", "0xH100", "x", "1xA100-40GB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sim, err := ParseSimulation(s)
		if err == nil && (sim.Count < 1 || sim.Count > MaxSimulatedGPUs || sim.Model.Name == "") {
			t.Fatalf("ParseSimulation(%q) = %+v", s, sim)
		}
	})
}

var uuidRE = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestSimulatedGPUs(t *testing.T) {
	sim, err := ParseSimulation("8xH100")
	if err != nil {
		t.Fatal(err)
	}
	a := SimulatedGPUs("n1", sim)
	b := SimulatedGPUs("n1", sim)
	other := SimulatedGPUs("n2", sim)
	seen := map[string]bool{}
	buses := map[string]bool{}
	for i, g := range a {
		if !uuidRE.MatchString(g.UUID) {
			t.Errorf("gpu %d uuid %q does not look like an NVML UUID", i, g.UUID)
		}
		if seen[g.UUID] {
			t.Errorf("gpu %d uuid %s repeated", i, g.UUID)
		}
		seen[g.UUID] = true
		buses[g.PCIBusID] = true
		if g.UUID != b[i].UUID {
			t.Errorf("gpu %d uuid not stable: %s then %s", i, g.UUID, b[i].UUID)
		}
		if g.UUID == other[i].UUID {
			t.Errorf("gpu %d uuid %s same for nodes n1 and n2", i, g.UUID)
		}
		if g.Index != i || !g.Healthy || g.Name != "NVIDIA H100 80GB HBM3" || g.MemoryBytes != 81559<<20 {
			t.Errorf("gpu %d = %+v", i, g)
		}
		if len(g.NVLinkPeers) != 7 {
			t.Errorf("gpu %d nvlink peers %v, want the 7 others", i, g.NVLinkPeers)
		}
	}
	if len(buses) != 8 {
		t.Errorf("got %d distinct PCI bus ids, want 8", len(buses))
	}
	big := SimulatedGPUs("n1", Simulation{Count: MaxSimulatedGPUs, Model: sim.Model})
	buses = map[string]bool{}
	for _, g := range big {
		buses[g.PCIBusID] = true
	}
	if len(buses) != MaxSimulatedGPUs {
		t.Errorf("got %d distinct PCI bus ids for %d GPUs", len(buses), MaxSimulatedGPUs)
	}
	l4, _ := ParseSimulation("2xL4")
	if g := SimulatedGPUs("n1", l4); g[0].NVLinkPeers != nil {
		t.Errorf("PCIe L4 has nvlink peers %v", g[0].NVLinkPeers)
	}
}

func TestSimulatedSource(t *testing.T) {
	sim, _ := ParseSimulation("4xA100")
	src := NewSimulated(Facts{NodeID: "n1", Hostname: "h", IP: "10.0.0.1", CPUs: 8, Labels: map[string]string{"zone": "a"}}, sim)
	inv, err := src.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inv.NodeID != "n1" || inv.IP != "10.0.0.1" || len(inv.GPUs) != 4 || inv.Labels["zone"] != "a" {
		t.Errorf("inventory = %+v", inv)
	}
	select {
	case <-src.Changed():
		t.Error("a simulation signalled a change nobody made")
	default:
	}
	// Busy GPUs: a change, and a process on each.
	if err := src.SetBusy([]int{1, 3}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-src.Changed():
	default:
		t.Error("SetBusy signalled no change")
	}
	inv, _ = src.Inventory(context.Background())
	for i, g := range inv.GPUs {
		if busy := len(g.Processes) > 0; busy != (i == 1 || i == 3) {
			t.Errorf("GPU %d processes %v", i, g.Processes)
		}
	}
	if err := inv.Validate(); err != nil {
		t.Error(err)
	}
	if err := src.SetBusy([]int{4}); err == nil || !strings.Contains(err.Error(), "GPUs 0 to 3") {
		t.Errorf("a GPU past the node's: %v", err)
	}
}

func TestSameInventory(t *testing.T) {
	sim, _ := ParseSimulation("2xH100")
	base := NewSimulatedInventory(t, sim)
	later := base
	later.ReportedAt = base.ReportedAt.Add(5e9)
	if !SameInventory(base, later) {
		t.Error("inventories differing only in reported_at must be the same")
	}
	noGPUs, emptyGPUs := base, base
	noGPUs.GPUs, emptyGPUs.GPUs = nil, []GPU{}
	if !SameInventory(noGPUs, emptyGPUs) {
		t.Error("nil and empty GPU lists must be the same")
	}
	sick := base
	sick.GPUs = append([]GPU(nil), base.GPUs...)
	sick.GPUs[1].Healthy = false
	if SameInventory(base, sick) {
		t.Error("a GPU turning unhealthy must be a change")
	}
	relabelled := base
	relabelled.Labels = map[string]string{"zone": "b"}
	if SameInventory(base, relabelled) {
		t.Error("a label change must be a change")
	}
}

func NewSimulatedInventory(t *testing.T, sim Simulation) NodeInventory {
	t.Helper()
	inv, err := NewSimulated(Facts{NodeID: "n1", Labels: map[string]string{"zone": "a"}}, sim).Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return inv
}
