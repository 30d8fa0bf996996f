package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// strGen makes the strings assignments hold, and the ones Marshal
// writes otherwise (escapes, HTML, U+2028, control characters, invalid
// UTF-8).
func strGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.SampledFrom([]string{"", "default", "train", "env", "sim-h100-00042", "10.0.0.1", "GPU-5f1c", "<b>", "a&b", "\u2028", "\b\f", "\x7f", "é"}),
		rapid.StringMatching(`[ -~]{0,10}`),
		rapid.String(),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 5), func(b []byte) string { return string(b) }),
	)
}

func floatGen() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.SampledFrom([]float64{0, 1, 0.25, 0.5, 0.125, 1.0 / 3, 8, 64, 1e-7, 1e-6, 1e20, 1e21, 1e300, -0.25, math.Copysign(0, -1)}),
		rapid.Float64(),
	)
}

// TestAssignmentJSONIsMarshal: Assignment.JSON writes what json.Marshal
// writes, byte for byte, and fails where it fails (a NaN or infinite
// share).
func TestAssignmentJSONIsMarshal(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := Assignment{Plan: strGen().Draw(t, "plan"), Revision: rapid.Int().Draw(t, "revision"), NodeID: strGen().Draw(t, "node")}
		if rapid.IntRange(0, 4).Draw(t, "workers") > 0 {
			a.Workers = []PlacedWorker{}
			for range rapid.IntRange(0, 5).Draw(t, "n") {
				w := PlacedWorker{Worker: plan.Worker{
					Component: plan.Component(strGen().Draw(t, "component")), Index: rapid.Int().Draw(t, "index"),
					Pool: strGen().Draw(t, "pool"), NodeID: strGen().Draw(t, "worker node"), IP: strGen().Draw(t, "ip"),
					GPUShare: floatGen().Draw(t, "share"), CPUs: floatGen().Draw(t, "cpus"),
				}, CUDAVisibleDevices: strGen().Draw(t, "cuda"), Plan: strGen().Draw(t, "worker plan"), Revision: rapid.Int().Draw(t, "worker revision")}
				if rapid.Bool().Draw(t, "gpus") {
					w.GPUs = rapid.SliceOfN(rapid.Int(), 0, 4).Draw(t, "gpu list")
				}
				if rapid.Bool().Draw(t, "uuids") {
					w.GPUUUIDs = rapid.SliceOfN(strGen(), 0, 4).Draw(t, "uuid list")
				}
				a.Workers = append(a.Workers, w)
			}
		}
		want, wantErr := json.Marshal(&a)
		got, err := a.JSON()
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(got, want) {
			t.Fatalf("JSON:\n got %s, %v\nwant %s, %v", got, err, want, wantErr)
		}
		// Appended to a buffer reused (another body's bytes left in its
		// room, or too little room), it writes the same.
		buf := rapid.SliceOfN(rapid.Byte(), 0, 600).Draw(t, "old body")[:0]
		got, err = a.AppendJSON(buf)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON:\n got %s, %v\nwant %s, %v", got, err, want, wantErr)
		}
	})
}

// BenchmarkAssignmentJSON writes a full 8-GPU node's assignment: 8
// one-GPU train workers and 24 quarter-GPU env workers.
func BenchmarkAssignmentJSON(b *testing.B) {
	a := Assignment{Plan: "default", Revision: 1, NodeID: "sim-h100-00042"}
	for g := range 8 {
		for k := range 4 {
			w := plan.Worker{Component: plan.Env, Index: 4*g + k, Pool: "env", NodeID: a.NodeID, IP: "10.0.0.42", GPUs: []int{g},
				GPUUUIDs: []string{fmt.Sprintf("GPU-5f1c0000-0000-0000-0000-%012d", g)}, GPUShare: 0.25}
			a.Workers = append(a.Workers, PlacedWorker{Worker: w, CUDAVisibleDevices: w.GPUUUIDs[0], Plan: "default", Revision: 1})
		}
	}
	b.Run("JSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := a.JSON(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Marshal", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(&a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
