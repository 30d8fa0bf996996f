package inventory

import (
	"reflect"
	"strings"
	"testing"
)

func TestUnplannedUse(t *testing.T) {
	busy := []Process{{PID: 42, Name: "python"}}
	nodes := []NodeInventory{
		{NodeID: "a", GPUs: []GPU{{Index: 0, UUID: "GPU-a0", Processes: busy}, {Index: 1, UUID: "GPU-a1", Processes: busy}, {Index: 2, UUID: "GPU-a2"}}},
		{NodeID: "b", GPUs: []GPU{{Index: 0, UUID: "GPU-b0", Processes: busy}}},
	}
	for _, c := range []struct {
		name   string
		placed map[string]bool
		want   []UnplannedGPU
	}{
		{"nothing placed", nil, []UnplannedGPU{{"a", 0, "GPU-a0", busy}, {"a", 1, "GPU-a1", busy}, {"b", 0, "GPU-b0", busy}}},
		{"busy GPUs placed", map[string]bool{"GPU-a0": true, "GPU-b0": true}, []UnplannedGPU{{"a", 1, "GPU-a1", busy}}},
		{"idle GPUs placed only", map[string]bool{"GPU-a2": true}, []UnplannedGPU{{"a", 0, "GPU-a0", busy}, {"a", 1, "GPU-a1", busy}, {"b", 0, "GPU-b0", busy}}},
		{"all placed", map[string]bool{"GPU-a0": true, "GPU-a1": true, "GPU-b0": true}, nil},
	} {
		if got := UnplannedUse(nodes, c.placed); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestProcessList: processes as people read them, bounded whatever a
// document lists: the first few, names clipped, and how many more.
func TestProcessList(t *testing.T) {
	long := strings.Repeat("x", MaxString)
	many := make([]Process, MaxProcesses)
	for i := range many {
		many[i] = Process{PID: uint32(i + 1), Name: long}
	}
	for _, c := range []struct {
		name string
		ps   []Process
		want string
	}{
		{"none", nil, ""},
		{"one", []Process{{PID: 42, Name: "python"}}, "pid 42 (python)"},
		{"no name", []Process{{PID: 7}, {PID: 8, Name: "a"}}, "pid 7, pid 8 (a)"},
		{"a long name", []Process{{PID: 1, Name: long}}, "pid 1 (" + strings.Repeat("x", 64) + "… (1024 bytes))"},
		{"many", many[:listedProcesses+1], "and 1 more"},
	} {
		got := ProcessList(c.ps)
		if c.name == "many" {
			if !strings.HasSuffix(got, c.want) || strings.Count(got, "pid ") != listedProcesses {
				t.Errorf("%s: %q, want %d processes and %q", c.name, got, listedProcesses, c.want)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := ProcessList(many); len(got) > 1024 || !strings.HasSuffix(got, "and 56 more") {
		t.Errorf("%d processes of %d-byte names: %d bytes: %.200q", len(many), len(long), len(got), got)
	}
}
