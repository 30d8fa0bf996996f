package inventory

import (
	"reflect"
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
