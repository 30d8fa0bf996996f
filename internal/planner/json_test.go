package planner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/poolplanner/poolplanner/plan"
)

// TestAppendJSONMatchesEncodingJSON: the hand-written encoder writes the
// document encoding/json writes, as far as any reader can tell: valid,
// degraded (unplaced workers) and invalid plans, with a pending spec or
// not.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, spec := genNodes(t), genSpec(t)
		for i := range nodes {
			if rapid.Bool().Draw(t, "uuids") {
				for g := 0; g < nodes[i].GPUs; g++ {
					nodes[i].GPUUUIDs = append(nodes[i].GPUUUIDs, rapid.StringMatching(`GPU-[a-f0-9"\\\n é]{0,8}`).Draw(t, "uuid"))
				}
			}
			if rapid.Bool().Draw(t, "models") {
				for range nodes[i].GPUs {
					nodes[i].Models = append(nodes[i].Models, rapid.StringMatching(`NVIDIA [A-Z0-9"é ]{0,6}`).Draw(t, "model"))
				}
				nodes[i].Domain = rapid.StringMatching(`[a-z0-9."\\]{0,6}`).Draw(t, "domain")
			}
		}
		p, _ := Compute(spec, nodes)
		if p.Valid() && len(nodes) > 1 && rapid.Bool().Draw(t, "degrade") {
			// A node leaves: degraded (or valid elsewhere), unplaced
			// workers with where they ran.
			i := rapid.IntRange(0, len(nodes)-1).Draw(t, "leaves")
			p, _, _ = Replan(p, spec, append(nodes[:i:i], nodes[i+1:]...))
		}
		if rapid.Bool().Draw(t, "pending") {
			p.PendingSpec = &plan.PendingSpec{Reason: rapid.String().Draw(t, "pendingReason")}
		}
		p.Name = rapid.String().Draw(t, "name")
		p.Reason = rapid.String().Draw(t, "reason")
		p.CreatedAt = time.Unix(rapid.Int64Range(0, 1<<37).Draw(t, "t"), rapid.Int64Range(0, 1e9-1).Draw(t, "ns")).UTC()
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		got := p.AppendJSON(nil)
		if !json.Valid(got) {
			t.Fatalf("invalid JSON:\n%s", got)
		}
		var a, b any
		_ = json.Unmarshal(want, &a)
		_ = json.Unmarshal(got, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("differs:\n got %s\nwant %s", got, want)
		}
	})
}

// TestWriteJSONMatchesAppendJSON: written in pieces, the document is the
// same bytes; at 2,000 nodes (several megabytes) the pieces are many.
func TestWriteJSONMatchesAppendJSON(t *testing.T) {
	nodes := make([]Node, 2000)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("node-%04d", i), IP: "10.0.0.1", GPUs: 8, CPUs: 64}
	}
	spec, err := ParseSpec([]byte("scheduling:\n  train: {worker_num: 4000, num_cpus: 0, num_gpus: 1}\n  env:\n    - {worker_num: 40000, num_cpus: 0, num_gpus: 0.25}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compute(spec, nodes)
	if err != nil {
		t.Fatal(err)
	}
	want := p.AppendJSON(nil)
	var got bytes.Buffer
	w := &countingWriter{w: &got}
	if err := p.WriteJSON(w); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("WriteJSON wrote %d bytes, AppendJSON %d; they differ", got.Len(), len(want))
	}
	if len(want) < 4<<20 || w.writes < 4 {
		t.Errorf("%d bytes in %d writes: not written in pieces", len(want), w.writes)
	}
}

type countingWriter struct {
	w      io.Writer
	writes int
}

func (c *countingWriter) Write(b []byte) (int, error) {
	c.writes++
	return c.w.Write(b)
}
