package planner

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestAppendJSONMatchesEncodingJSON: the hand-written encoder writes the
// document encoding/json writes, as far as any reader can tell.
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
