package inventory

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"pgregory.net/rapid"
)

// stringGen makes strings as documents hold them, and some they should
// not: escapes, control characters, non-ASCII, invalid UTF-8.
func stringGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.SampledFrom([]string{"", "n1", "sim-h100-00042", "GPU-5f1c", "NVIDIA H100 80GB HBM3", "0000:1b:00.0", "zone", "a"}),
		rapid.StringMatching(`[a-z0-9./_-]{0,12}`),
		rapid.String(),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 6), func(b []byte) string { return string(b) }),
	)
}

func gpuGen() *rapid.Generator[GPU] {
	return rapid.Custom(func(t *rapid.T) GPU {
		g := GPU{
			Index:       rapid.IntRange(-2, 70).Draw(t, "index"),
			UUID:        stringGen().Draw(t, "uuid"),
			Name:        stringGen().Draw(t, "name"),
			MemoryBytes: rapid.Uint64().Draw(t, "mem"),
			PCIBusID:    stringGen().Draw(t, "pci"),
			Healthy:     rapid.Bool().Draw(t, "healthy"),
			MIGEnabled:  rapid.Bool().Draw(t, "mig"),
		}
		if rapid.Bool().Draw(t, "sick") {
			g.UnhealthyReason = stringGen().Draw(t, "why")
		}
		if rapid.Bool().Draw(t, "numa") {
			g.NUMANode = new(rapid.IntRange(-1, 8).Draw(t, "numa node"))
		}
		if rapid.Bool().Draw(t, "peers") {
			g.NVLinkPeers = rapid.SliceOfN(rapid.IntRange(0, 70), 0, 8).Draw(t, "peer list")
		}
		if rapid.Bool().Draw(t, "fabric") {
			g.Fabric = &Fabric{ClusterUUID: stringGen().Draw(t, "cluster"), CliqueID: rapid.Uint32().Draw(t, "clique")}
		}
		if rapid.Bool().Draw(t, "procs") {
			for range rapid.IntRange(0, 3).Draw(t, "nprocs") {
				g.Processes = append(g.Processes, Process{PID: rapid.Uint32().Draw(t, "pid"), UsedMemoryBytes: rapid.Uint64().Draw(t, "used"), Name: stringGen().Draw(t, "comm")})
			}
		}
		return g
	})
}

func nodeGen() *rapid.Generator[NodeInventory] {
	return rapid.Custom(func(t *rapid.T) NodeInventory {
		n := NodeInventory{
			NodeID:        stringGen().Draw(t, "node_id"),
			Hostname:      stringGen().Draw(t, "hostname"),
			IP:            stringGen().Draw(t, "ip"),
			CPUs:          rapid.IntRange(-1, 512).Draw(t, "cpus"),
			MemoryBytes:   rapid.Uint64().Draw(t, "memory"),
			DriverVersion: stringGen().Draw(t, "driver"),
			ReportedAt:    time.Unix(rapid.Int64Range(0, 4e9).Draw(t, "at"), rapid.Int64Range(0, 999999999).Draw(t, "ns")).UTC(),
			Reporter:      stringGen().Draw(t, "reporter"),
			ReporterPID:   rapid.IntRange(0, 1<<22).Draw(t, "pid"),
		}
		if rapid.Bool().Draw(t, "gpus") {
			n.GPUs = rapid.SliceOfN(gpuGen(), 0, 9).Draw(t, "gpu list")
		}
		if rapid.Bool().Draw(t, "labels") {
			n.Labels = rapid.MapOfN(stringGen(), stringGen(), 0, 4).Draw(t, "label map")
		}
		if rapid.Bool().Draw(t, "cuda") {
			n.CUDADriverVersion = stringGen().Draw(t, "cuda")
		}
		return n
	})
}

// sameAsJSON fails t unless Decode, and DecodeShared with shared, read
// data as json.Unmarshal does: the same value and the same error, in
// words.
func sameAsJSON(t *rapid.T, data []byte, shared *Strings) {
	var want NodeInventory
	wantErr := json.Unmarshal(data, &want)
	for _, tab := range []*Strings{nil, shared} {
		var got NodeInventory
		gotErr := DecodeShared(data, &got, tab)
		if tab == nil {
			var plain NodeInventory
			plainErr := Decode(data, &plain)
			if fmt.Sprint(plainErr) != fmt.Sprint(gotErr) || !reflect.DeepEqual(plain, got) {
				t.Fatalf("document %q: Decode %#v (%v), DecodeShared without a table %#v (%v)", data, plain, plainErr, got, gotErr)
			}
		}
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("document %q (shared %v): error %v, encoding/json's %v", data, tab != nil, gotErr, wantErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("document %q (shared %v):\n got %#v\nwant %#v", data, tab != nil, got, want)
		}
	}
}

// TestDecodeIsEncodingJSON: Decode reads every document as encoding/json
// does (value and error), whether written by json.Marshal, indented,
// with a field written twice, unknown or spelled in other case, or cut
// and altered anywhere.
func TestDecodeIsEncodingJSON(t *testing.T) {
	shared := NewStrings() // across documents, as a store's
	rapid.Check(t, func(t *rapid.T) {
		n := nodeGen().Draw(t, "node")
		data, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		switch rapid.IntRange(0, 5).Draw(t, "form") {
		case 0:
			data, _ = json.MarshalIndent(n, "", "  ")
		case 1:
			// A field twice, unknown, in other case, or null.
			extra := rapid.SampledFrom([]string{`"cpus":3`, `"gpus":[{"index":1}]`, `"labels":{"b":"c"}`, `"extra":[1,{"a":null}]`,
				`"Node_ID":"x"`, `"hostname":null`, `"gpus":null`, `"reported_at":"2026-01-02T03:04:05Z"`, `"reported_at":"yesterday"`,
				`"cpus":1.5`, `"cpus":1e2`, `"memory_bytes":-1`, `"cpus":99999999999999999999`}).Draw(t, "extra")
			data = append([]byte(`{`+extra+`,`), data[1:]...)
			if rapid.Bool().Draw(t, "after") {
				data = append(data[:len(data)-1], []byte(`,`+extra+`}`)...)
			}
		case 2:
			// An edit anywhere: cut, a byte replaced or inserted.
			at := rapid.IntRange(0, len(data)).Draw(t, "at")
			c := rapid.SampledFrom([]byte(`{}[]",:0-9.eE tnfu\`+"\x00\x80")).Draw(t, "byte")
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
		sameAsJSON(t, data, shared)
	})
}

// TestDecodeFixed: documents of each shape Decode leaves to
// encoding/json, and those it reads itself.
func TestDecodeFixed(t *testing.T) {
	for _, doc := range []string{
		`{}`, `null`, ``, ` `, `[]`, `{"node_id":"n1"} x`, `{"gpus":[]}`, `{"labels":{}}`, `{"gpus":[{"nvlink_peers":[],"processes":[]}]}`,
		`{"node_id":"n\u0031"}`, `{"node_id":"\u00e9"}`, "{\"node_id\":\"\xff\"}", `{"gpus":[{"index":-0}]}`, `{"gpus":[{"index":01}]}`,
		`{"labels":{"a":"1","a":"2"}}`, `{"gpus":[{"fabric":{"clique_id":4294967296}}]}`, `{"gpus":[{"processes":[{"pid":-1}]}]}`,
		`{"reported_at":"2026-12-02T03:04:05.123456789+01:00"}`, `{"reported_at":"2026-12-02 03:04:05"}`, `{"cpus":true}`, `{"gpus":[{"healthy":1}]}`,
		` { "node_id" : "n1" , "cpus" : 64 } `, `{"node_id":"n1",}`, `{"node_id":"n1" "ip":"x"}`,
	} {
		t.Run(doc, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { sameAsJSON(t, []byte(doc), NewStrings()) })
		})
	}
}

// TestDecodeShares: documents decoded with one table share one copy of
// each string they repeat (a GPU's model, its bus id), never the ones
// each node has of its own (node id, GPU UUID); the table stops taking
// values at its bound and never takes long ones, and values stay right
// past it.
func TestDecodeShares(t *testing.T) {
	doc := func(node, model, bus string) []byte {
		return []byte(`{"node_id":"` + node + `","gpus":[{"index":0,"uuid":"GPU-` + node + `","name":"` + model + `","pci_bus_id":"` + bus + `"}]}`)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	shared := NewStrings()
	var a, b NodeInventory
	if err := DecodeShared(doc("n1", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"), &a, shared); err != nil {
		t.Fatal(err)
	}
	if err := DecodeShared(doc("n2", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"), &b, shared); err != nil {
		t.Fatal(err)
	}
	ga, gb := a.GPUs[0], b.GPUs[0]
	if !same(ga.Name, gb.Name) || !same(ga.PCIBusID, gb.PCIBusID) {
		t.Errorf("model and bus id not shared between nodes")
	}
	if same(ga.UUID, gb.UUID) || ga.UUID == gb.UUID {
		t.Errorf("UUIDs %q and %q", ga.UUID, gb.UUID)
	}
	var c NodeInventory
	if err := Decode(doc("n3", "NVIDIA H100 80GB HBM3", "x"), &c); err != nil || same(c.GPUs[0].Name, ga.Name) {
		t.Errorf("Decode without a table shared a string (err %v)", err)
	}
	for i := range maxShared + 10 {
		var n NodeInventory
		model := fmt.Sprint("model-", i)
		if err := DecodeShared(doc("n", model, "b"), &n, shared); err != nil || n.GPUs[0].Name != model {
			t.Fatalf("model %d: %q (%v)", i, n.GPUs[0].Name, err)
		}
	}
	if len(shared.m) != maxShared {
		t.Errorf("table holds %d values, want its bound %d", len(shared.m), maxShared)
	}
	long := strings.Repeat("x", maxSharedLen+1)
	fresh := NewStrings()
	var l NodeInventory
	if err := DecodeShared(doc("n", long, "b"), &l, fresh); err != nil || l.GPUs[0].Name != long || len(fresh.m) != 1 {
		t.Errorf("a long value: %q kept, table %d (%v)", l.GPUs[0].Name, len(fresh.m), err)
	}
}

// TestDecodeSharesPeers: documents decoded with one table share one copy
// of each NVLink peer list and NUMA node they repeat, each list's
// capacity its length (an append copies, never writing into another
// document's list); without a table, or past the table's bound, each
// document has its own, and values are right either way.
func TestDecodeSharesPeers(t *testing.T) {
	doc := func(node, peers string, numa int) []byte {
		return []byte(fmt.Sprintf(`{"node_id":%q,"gpus":[{"index":0,"uuid":"GPU-%s","numa_node":%d,"nvlink_peers":%s}]}`, node, node, numa, peers))
	}
	decode := func(data []byte, tab *Strings) GPU {
		t.Helper()
		var n NodeInventory
		if err := DecodeShared(data, &n, tab); err != nil {
			t.Fatal(err)
		}
		return n.GPUs[0]
	}
	for _, tc := range []struct {
		name       string
		tab        *Strings
		wantShared bool
	}{
		{"shared", NewStrings(), true},
		{"no table", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := decode(doc("n1", "[1, 2,3]", 1), tc.tab), decode(doc("n2", "[1, 2,3]", 1), tc.tab)
			if !slices.Equal(a.NVLinkPeers, []int{1, 2, 3}) || !slices.Equal(b.NVLinkPeers, []int{1, 2, 3}) || *a.NUMANode != 1 || *b.NUMANode != 1 {
				t.Fatalf("peers %v %v, NUMA %d %d", a.NVLinkPeers, b.NVLinkPeers, *a.NUMANode, *b.NUMANode)
			}
			if got := &a.NVLinkPeers[0] == &b.NVLinkPeers[0]; got != tc.wantShared {
				t.Errorf("peer lists shared %v, want %v", got, tc.wantShared)
			}
			if got := a.NUMANode == b.NUMANode; got != tc.wantShared {
				t.Errorf("NUMA nodes shared %v, want %v", got, tc.wantShared)
			}
			if cap(a.NVLinkPeers) != len(a.NVLinkPeers) {
				t.Errorf("peer list capacity %d, length %d", cap(a.NVLinkPeers), len(a.NVLinkPeers))
			}
			if e := decode(doc("n3", "[]", 0), tc.tab); e.NVLinkPeers == nil || len(e.NVLinkPeers) != 0 || *e.NUMANode != 0 {
				t.Errorf("empty list %#v, NUMA %d: want [], 0 as encoding/json", e.NVLinkPeers, *e.NUMANode)
			}
		})
	}
	full := NewStrings()
	for i := range maxShared + 10 {
		peers := fmt.Sprintf("[%d]", i)
		if g := decode(doc("n", peers, i), full); !slices.Equal(g.NVLinkPeers, []int{i}) || *g.NUMANode != i {
			t.Fatalf("list %s: %v, NUMA %d", peers, g.NVLinkPeers, *g.NUMANode)
		}
	}
	if len(full.peers) != maxShared || len(full.numas) != maxShared {
		t.Errorf("table holds %d lists and %d NUMA nodes, want its bound %d", len(full.peers), len(full.numas), maxShared)
	}
}

// BenchmarkDecode reads a simulated 8-GPU node's document.
func BenchmarkDecode(b *testing.B) {
	sim, _ := ParseSimulation("8xH100")
	inv, _ := NewSimulated(Facts{NodeID: "sim-h100-00042", IP: "10.0.0.1", CPUs: 64}, sim).Inventory(b.Context())
	inv.ReportedAt = time.Now().UTC()
	data, _ := json.Marshal(inv)
	b.Run("Decode", func(b *testing.B) {
		for b.Loop() {
			var n NodeInventory
			if err := Decode(data, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var n NodeInventory
			if err := json.Unmarshal(data, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
}
