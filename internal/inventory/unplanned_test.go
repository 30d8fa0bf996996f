package inventory

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
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

// TestUnplannedInIsUnplannedUse: UnplannedIn, which looks up only the
// busy GPUs, says what UnplannedUse says with the set of every UUID the
// documents place workers on.
func TestUnplannedInIsUnplannedUse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		uuid := rapid.SampledFrom([]string{"GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5"})
		var nodes []NodeInventory
		for i := range rapid.IntRange(0, 4).Draw(t, "nodes") {
			n := NodeInventory{NodeID: fmt.Sprintf("n%d", i)}
			for j := range rapid.IntRange(0, 4).Draw(t, "gpus") {
				g := GPU{Index: j, UUID: uuid.Draw(t, "uuid")}
				if rapid.Bool().Draw(t, "busy") {
					g.Processes = []Process{{PID: uint32(j + 1), Name: "python"}}
				}
				n.GPUs = append(n.GPUs, g)
			}
			nodes = append(nodes, n)
		}
		var docs []*plan.Document
		placed := map[string]bool{}
		for range rapid.IntRange(0, 3).Draw(t, "docs") {
			var ws []plan.Worker
			for range rapid.IntRange(0, 4).Draw(t, "workers") {
				us := rapid.SliceOfN(uuid, 0, 3).Draw(t, "placed on")
				for _, u := range us {
					placed[u] = true
				}
				ws = append(ws, plan.Worker{GPUUUIDs: us})
			}
			docs = append(docs, &plan.Document{Placement: plan.Placement{Workers: plan.NewWorkers(ws)}})
		}
		if got, want := UnplannedIn(nodes, docs...), UnplannedUse(nodes, placed); !reflect.DeepEqual(got, want) {
			t.Fatalf("UnplannedIn %+v, UnplannedUse %+v", got, want)
		}
	})
}
