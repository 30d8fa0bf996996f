package client

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"unsafe"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// decodeStringGen makes strings as assignments hold them, and some they
// should not: escapes, control characters, non-ASCII, invalid UTF-8.
func decodeStringGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.SampledFrom([]string{"", "default", "sim-h100-00042", "10.0.0.1", "GPU-5f1c", "train", "env", "pool-a", "0,1"}),
		rapid.StringMatching(`[a-z0-9.,/_-]{0,12}`),
		rapid.String(),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 6), func(b []byte) string { return string(b) }),
	)
}

func decodeFloatGen() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.SampledFrom([]float64{0, 1, 0.25, 0.5, 4, 1e-7, 1e21, 123456.789, -2}),
		rapid.Float64(),
	)
}

func placedWorkerGen() *rapid.Generator[PlacedWorker] {
	return rapid.Custom(func(t *rapid.T) PlacedWorker {
		w := PlacedWorker{
			Worker: plan.Worker{
				Component: plan.Component(decodeStringGen().Draw(t, "component")),
				Index:     rapid.IntRange(-2, 1<<20).Draw(t, "index"),
				Pool:      decodeStringGen().Draw(t, "pool"),
				NodeID:    decodeStringGen().Draw(t, "node"),
				IP:        decodeStringGen().Draw(t, "ip"),
				GPUShare:  decodeFloatGen().Draw(t, "share"),
				CPUs:      decodeFloatGen().Draw(t, "cpus"),
			},
			CUDAVisibleDevices: decodeStringGen().Draw(t, "cuda"),
			Plan:               decodeStringGen().Draw(t, "plan"),
			Revision:           rapid.IntRange(-1, 1<<40).Draw(t, "revision"),
		}
		if rapid.Bool().Draw(t, "gpus") {
			w.GPUs = rapid.SliceOfN(rapid.IntRange(-1, 70), 0, 8).Draw(t, "gpu list")
		}
		if rapid.Bool().Draw(t, "uuids") {
			w.GPUUUIDs = rapid.SliceOfN(decodeStringGen(), 0, 8).Draw(t, "uuid list")
		}
		return w
	})
}

// sameAssignmentAsJSON fails t unless decodeAssignment reads data as
// json.Unmarshal does: the same value and the same error, in words.
func sameAssignmentAsJSON(t *rapid.T, data []byte) {
	want, got := Assignment{Seq: 7}, Assignment{Seq: 7}
	wantErr := json.Unmarshal(data, &want)
	gotErr := decodeAssignment(data, &got)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("body %q: error %v, encoding/json's %v", data, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("body %q:\n got %#v\nwant %#v", data, got, want)
	}
}

// TestDecodeAssignmentIsEncodingJSON: decodeAssignment reads every body
// as encoding/json does (value and error), whether written by the
// planner's writer or json.Marshal, indented, with a field written
// twice, unknown or spelled in other case, or cut and altered anywhere.
func TestDecodeAssignmentIsEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := Assignment{
			Plan:     decodeStringGen().Draw(t, "plan"),
			Revision: rapid.IntRange(-1, 1<<40).Draw(t, "revision"),
			NodeID:   decodeStringGen().Draw(t, "node"),
		}
		if rapid.IntRange(0, 5).Draw(t, "nil workers") > 0 {
			a.Workers = rapid.SliceOfN(placedWorkerGen(), 0, 6).Draw(t, "workers")
		}
		data, err := json.Marshal(&a)
		if err != nil {
			t.Skip("not marshalable") // NaN or an infinity drawn: no body has them
		}
		switch rapid.IntRange(0, 5).Draw(t, "form") {
		case 0:
			data, _ = json.MarshalIndent(&a, "", "  ")
		case 1:
			if own, err := a.JSON(); err == nil {
				data = own
			}
		case 2:
			// A field twice, unknown, in other case, or null.
			extra := rapid.SampledFrom([]string{`"revision":3`, `"workers":[{"index":1}]`, `"workers":[{"gpus":null}]`,
				`"workers":[{"gpus":[1],"gpus":[2]}]`, `"extra":[1,{"a":null}]`, `"Plan":"x"`, `"node_id":null`, `"workers":null`,
				`"revision":1.5`, `"revision":1e2`, `"revision":-0`, `"revision":99999999999999999999`,
				`"workers":[{"cpus":1e400}]`, `"workers":[{"gpu_share":-0.0}]`, `"workers":[{"cpus":"1"}]`,
				`"workers":[{"revision":2.0}]`, `"workers":[{"Index":2}]`, `"workers":[{"gpus":[01]}]`}).Draw(t, "extra")
			data = append([]byte(`{`+extra+`,`), data[1:]...)
			if rapid.Bool().Draw(t, "after") {
				data = append(data[:len(data)-1], []byte(`,`+extra+`}`)...)
			}
		case 3:
			// An edit anywhere: cut, a byte replaced or inserted.
			at := rapid.IntRange(0, len(data)).Draw(t, "at")
			c := rapid.SampledFrom([]byte(`{}[]",:0-9.eE+ tnfu\`+"\x00\x80")).Draw(t, "byte")
			switch rapid.IntRange(0, 2).Draw(t, "edit") {
			case 0:
				data = data[:at]
			case 1:
				if at < len(data) {
					data[at] = c
				}
			default:
				data = append(data[:at:at], append([]byte{c}, data[at:]...)...)
			}
		}
		sameAssignmentAsJSON(t, data)
	})
}

// TestDecodeAssignmentFixed: bodies of each shape decodeAssignment
// leaves to encoding/json, and those it reads itself.
func TestDecodeAssignmentFixed(t *testing.T) {
	for _, body := range []string{
		`{}`, `null`, ``, ` `, `[]`, `{"plan":"p"} x`, `{"workers":[]}`, `{"workers":[{}]}`, `{"workers":[{"gpus":[],"gpu_uuids":[]}]}`,
		`{"plan":"p\u0031"}`, `{"plan":"\u00e9"}`, "{\"plan\":\"\xff\"}", "{\"plan\":\"é\"}", `{"revision":-0}`, `{"revision":01}`,
		`{"workers":[{"cpus":0.25e1}]}`, `{"workers":[{"cpus":1.}]}`, `{"workers":[{"cpus":.5}]}`, `{"workers":[{"cpus":1e}]}`,
		`{"workers":[{"cpus":1E+2}]}`, `{"workers":[{"cpus":-}]}`, `{"workers":[{"gpu_share":1e-400}]}`,
		`{"revision":true}`, `{"workers":[{"index":9223372036854775808}]}`, `{"workers":[{"index":-9223372036854775808}]}`,
		`{"workers":null}`, `{"workers":nul}`, `{"workers":nullx}`, `{"workers":[{"gpus":null,"gpu_uuids":null}]}`, `{"workers":[{"gpus":[1,2,3]}]}`,
		`{"plan":null}`, `{"workers":[{"gpus":[1,]}]}`, `{"workers":[{"gpu_uuids":["a,b]","c"]}]}`, `{"workers":[{"gpus":[1]`,
		` { "plan" : "p" , "revision" : 4 } `, `{"plan":"p",}`, `{"plan":"p" "revision":1}`, `{"workers":[{"plan":"a","revision":1},]}`,
		`{"plan":"default","revision":1,"node_id":"n1","workers":[{"component":"env","index":0,"pool":"env","node_id":"n1","ip":"10.0.0.1","gpus":[0],"gpu_uuids":["GPU-0"],"gpu_share":0.25,"cpus":1,"cuda_visible_devices":"GPU-0","plan":"default","revision":1}]}`,
	} {
		t.Run(body, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { sameAssignmentAsJSON(t, []byte(body)) })
		})
	}
}

// TestDecodeAssignmentShares: the strings an assignment repeats are one
// string, so that reading 20,000 assignments does not copy each.
func TestDecodeAssignmentShares(t *testing.T) {
	a := Assignment{Plan: "default", Revision: 3, NodeID: "n1"}
	for i := range 4 {
		a.Workers = append(a.Workers, PlacedWorker{
			Worker:             plan.Worker{Component: "env", Index: i, Pool: "env", NodeID: "n1", IP: "10.0.0.1", GPUs: []int{0}, GPUUUIDs: []string{"GPU-0"}, GPUShare: 0.25, CPUs: 1},
			CUDAVisibleDevices: "GPU-0", Plan: "default", Revision: 3,
		})
	}
	// A worker without GPUs, whose lists the writer writes as null.
	a.Workers = append(a.Workers, PlacedWorker{Worker: plan.Worker{Component: "env", Index: 4, Pool: "env", NodeID: "n1", IP: "10.0.0.1", CPUs: 1}, Plan: "default", Revision: 3})
	data, err := a.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got Assignment
	if err := decodeAssignment(data, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("got %#v, want %#v", got, a)
	}
	same := func(what string, x, y string) {
		if len(x) > 0 && unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q read twice as two strings", what, x)
		}
	}
	for i := 1; i < len(got.Workers); i++ {
		w, first := got.Workers[i], got.Workers[0]
		same("pool", w.Pool, first.Pool)
		same("node", w.NodeID, got.NodeID)
		same("plan", w.Plan, got.Plan)
		if len(w.GPUUUIDs) > 0 {
			same("uuid", w.GPUUUIDs[0], first.GPUUUIDs[0])
		}
		same("component", string(w.Component), string(first.Component))
	}
}
