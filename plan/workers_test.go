package plan

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// oldWorkers is how Workers.UnmarshalJSON read a list before it decoded
// into chunks: one slice, then wrapped.
func oldWorkers(b []byte) (Workers, error) {
	var list []Worker
	if err := json.Unmarshal(b, &list); err != nil {
		return Workers{}, err
	}
	return NewWorkers(list), nil
}

// TestWorkersUnmarshalIsSliceUnmarshal: decoding a list of workers into
// chunks, their strings shared, reads what decoding it into one slice
// read (the same workers, in order, chunked alike), and refuses what it
// refused, for lists of any length around the chunk size and for
// documents that are not lists of workers.
func TestWorkersUnmarshalIsSliceUnmarshal(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		node := rapid.SampledFrom([]string{"n1", "n2", "node-000003"})
		uuid := rapid.SampledFrom([]string{"GPU-a", "GPU-b", "GPU-c"})
		n := rapid.OneOf(rapid.IntRange(0, 3), rapid.IntRange(ChunkLen-2, ChunkLen+2), rapid.IntRange(0, 3*ChunkLen)).Draw(t, "workers")
		ws := make([]Worker, n)
		for i := range ws {
			ws[i] = Worker{Component: rapid.SampledFrom(GPUComponents[:]).Draw(t, "component"), Index: i, Pool: "p0",
				NodeID: node.Draw(t, "node"), IP: "10.0.0.1", GPUs: rapid.SliceOfN(rapid.IntRange(0, 7), 0, 2).Draw(t, "gpus"),
				GPUUUIDs: rapid.SliceOfN(uuid, 0, 2).Draw(t, "uuids"), GPUShare: 0.25, CPUs: 1}
			if len(ws[i].GPUs) == 0 {
				ws[i].GPUs = nil
			}
			if len(ws[i].GPUUUIDs) == 0 {
				ws[i].GPUUUIDs = nil
			}
		}
		doc, err := json.Marshal(NewWorkers(ws))
		if err != nil {
			t.Fatal(err)
		}
		text := string(doc)
		switch rapid.IntRange(0, 5).Draw(t, "form") {
		case 1:
			text = "null"
		case 2:
			text = `{"workers": 1}`
		case 3:
			text = strings.Replace(text, `"index":0`, `"index":"zero"`, 1)
		case 4:
			text = strings.Replace(text, "[", "[null,", 1)
		case 5:
			text = `"workers"`
		}
		var got Workers
		gotErr := got.UnmarshalJSON([]byte(text))
		want, wantErr := oldWorkers([]byte(text))
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%.200s: error %v, the slice's %v", text, gotErr, wantErr)
		}
		if gotErr != nil {
			return
		}
		if !reflect.DeepEqual(got.Slice(), want.Slice()) || got.Len() != want.Len() {
			t.Fatalf("%.200s: read %d workers, the slice %d, or differently", text, got.Len(), want.Len())
		}
		if fmt.Sprint(chunkLens(got)) != fmt.Sprint(chunkLens(want)) {
			t.Fatalf("chunks %v, the slice's %v", chunkLens(got), chunkLens(want))
		}
	})
}

func chunkLens(ws Workers) []int {
	var out []int
	for _, c := range ws.Chunks() {
		out = append(out, len(c))
	}
	return out
}

// TestWorkersTypeErrorNamesKind: a document whose workers are not a list
// is refused in encoding/json's words for a slice of workers, naming the
// kind of value found and the field, never echoing the value.
func TestWorkersTypeErrorNamesKind(t *testing.T) {
	for _, c := range []struct{ value, kind string }{
		{`"secret-token"`, "string"}, {`12345`, "number"}, {`true`, "bool"}, {`{"a":"secret-token"}`, "object"},
	} {
		t.Run(c.kind, func(t *testing.T) {
			doc := []byte(`{"workers":` + c.value + `}`)
			var got struct {
				Workers Workers `json:"workers"`
			}
			var want struct {
				Workers []Worker `json:"workers"`
			}
			gotErr, wantErr := json.Unmarshal(doc, &got), json.Unmarshal(doc, &want)
			if gotErr == nil || wantErr == nil {
				t.Fatalf("accepted: %v, slice %v", gotErr, wantErr)
			}
			if strings.Contains(gotErr.Error(), "secret") || strings.Contains(gotErr.Error(), "12345") {
				t.Errorf("error echoes the value: %v", gotErr)
			}
			if !strings.Contains(gotErr.Error(), "cannot unmarshal "+c.kind+" into") || !strings.Contains(gotErr.Error(), "workers") {
				t.Errorf("error %q, want it to name %s and the field (encoding/json: %q)", gotErr, c.kind, wantErr)
			}
		})
	}
}
