package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// nodeIDGen makes node ids as clusters name them: a prefix, often a
// number (zero-padded or not), sometimes a suffix, sometimes no number.
func nodeIDGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		prefix := rapid.SampledFrom([]string{"n", "node-", "sim-h100-", "gpu", "a.b/", "x1y-", ""}).Draw(t, "prefix")
		suffix := rapid.SampledFrom([]string{"", "", ".rack", "-b", "z"}).Draw(t, "suffix")
		switch rapid.IntRange(0, 9).Draw(t, "form") {
		case 0:
			return prefix + "host" + suffix
		case 1:
			width := rapid.IntRange(1, 6).Draw(t, "width")
			return prefix + fmt.Sprintf("%0*d", width, rapid.IntRange(0, 999999).Draw(t, "n")) + suffix
		case 2:
			return prefix + "18446744073709551615" + suffix
		}
		return prefix + fmt.Sprint(rapid.IntRange(0, 100000).Draw(t, "n")) + suffix
	})
}

// TestNextNodeIDIsWhatFollows: NextNodeID names exactly the id that
// Follows an id, so runs folded with it expand to the ids folded.
func TestNextNodeIDIsWhatFollows(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := nodeIDGen().Draw(t, "id")
		next, ok := NextNodeID(id)
		if ok && !Follows(id, next) {
			t.Fatalf("NextNodeID(%q) = %q, which does not follow it", id, next)
		}
		other := nodeIDGen().Draw(t, "other")
		if Follows(id, other) && (!ok || next != other) {
			t.Fatalf("%q follows %q, NextNodeID says %q, %v", other, id, next, ok)
		}
	})
	for _, c := range []struct {
		id, next string
		ok       bool
	}{
		{"n9", "n10", true},
		{"n09", "n10", true},
		{"n099", "n100", true},
		{"n0", "n1", true},
		{"sim-h100-0042.rack", "sim-h100-0043.rack", true},
		{"a1b9", "a1b10", true},
		{"host", "", false},
		{"n18446744073709551615", "", false},
		{"n99999999999999999999999", "", false},
	} {
		next, ok := NextNodeID(c.id)
		if next != c.next || ok != c.ok {
			t.Errorf("NextNodeID(%q) = %q, %v; want %q, %v", c.id, next, ok, c.next, c.ok)
		}
	}
	// The largest number has no follower: one past it wraps to 0.
	if Follows("n18446744073709551615z", "n0z") {
		t.Error(`"n0z" follows "n18446744073709551615z"`)
	}
}

// TestSummaryRoundTrip: a summary, through JSON and expanded, holds
// exactly the nodes, workers and GPUs it was made of, each node once;
// a node set again holds what it was set to last, one set with no
// workers is gone.
func TestSummaryRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var b SummaryBuilder
		want := map[string]string{}
		total := 0
		set := func(id string) {
			workers := rapid.IntRange(0, 40).Draw(t, "workers")
			gpus := rapid.SliceOfN(rapid.IntRange(0, 70), 0, 12).Draw(t, "gpus")
			b.Set(id, workers, gpus)
			if old, ok := want[id]; ok {
				var n int
				fmt.Sscan(old, &n)
				total -= n
				delete(want, id)
			}
			if workers > 0 {
				g := slices.Clone(gpus)
				slices.Sort(g)
				want[id] = fmt.Sprint(workers, slices.Compact(g))
				total += workers
			}
		}
		var ids []string
		for range rapid.IntRange(0, 40).Draw(t, "nodes") {
			id := nodeIDGen().Draw(t, "id")
			if rapid.Bool().Draw(t, "series") {
				// A series of ids, as clusters number their nodes.
				for range rapid.IntRange(1, 30).Draw(t, "series len") {
					set(id)
					ids = append(ids, id)
					if next, ok := NextNodeID(id); ok && rapid.IntRange(0, 5).Draw(t, "gap") > 0 {
						id = next
					} else {
						id = nodeIDGen().Draw(t, "id")
					}
				}
				continue
			}
			set(id)
			ids = append(ids, id)
		}
		// Some nodes set again, as a change event sets them.
		if len(ids) > 0 {
			for range rapid.IntRange(0, 5).Draw(t, "again") {
				set(rapid.SampledFrom(ids).Draw(t, "again id"))
			}
		}
		s := b.Summary("p", 3, 9)
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back Summary
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		err = back.Each(func(node string, workers int, rs []Range) bool {
			if _, dup := got[node]; dup {
				t.Fatalf("node %s twice", node)
			}
			gpus := []int{}
			for _, r := range rs {
				for g := r.First; g <= r.Last; g++ {
					gpus = append(gpus, g)
				}
			}
			got[node] = fmt.Sprint(workers, gpus)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("expanded %v, want %v (summary %s)", got, want, data)
		}
		if back.Name != "p" || back.Revision != 3 || back.Seq != 9 || back.Workers != total {
			t.Fatalf("header fields %+v, want %d workers", back, total)
		}
	})
}

// TestSummaryFolds: 20,000 numbered nodes held alike are a few runs.
func TestSummaryFolds(t *testing.T) {
	var b SummaryBuilder
	for i := 1; i <= 10000; i++ {
		b.Set(fmt.Sprintf("sim-h100-%d", i), 8, []int{7, 6, 5, 4, 3, 2, 1, 0})
		b.Set(fmt.Sprintf("sim-h200-%05d", i), 8, []int{0, 1, 2, 3, 4, 5, 6, 7})
	}
	b.Set("sim-h100-77", 3, []int{0, 1, 1, 3})
	b.Set("sim-h100-5000", 8, nil)
	b.Set("sim-h100-5000", 0, nil)
	b.Set("buffers", 2, nil)
	data, _ := json.Marshal(b.Summary("default", 1, 1))
	want := `{"name":"default","revision":1,"seq":1,"workers":159989,"held":[` +
		`{"gpus":[],"workers":2,"nodes":[{"first":"buffers","count":1}]},` +
		`{"gpus":[[0,1],[3,3]],"workers":3,"nodes":[{"first":"sim-h100-77","count":1}]},` +
		`{"gpus":[[0,7]],"workers":8,"nodes":[{"first":"sim-h100-1","count":76},{"first":"sim-h100-78","count":4922},` +
		`{"first":"sim-h100-5001","count":5000},{"first":"sim-h200-00001","count":10000}]}]}`
	if string(data) != want {
		t.Errorf("summary\n got %s\nwant %s", data, want)
	}
}

// TestSummaryEachRefuses: a summary that cannot be expanded is an error
// that names the part at fault, never a panic or a flood of nodes.
func TestSummaryEachRefuses(t *testing.T) {
	for _, c := range []struct {
		name    string
		workers int
		held    []HeldGPUs
		want    string
	}{
		{"no next id", 16, []HeldGPUs{{GPUs: []Range{{0, 7}}, Workers: 8, Nodes: []NodeRun{{"host", 2}}}}, `"host" has no next node id`},
		{"zero count", 0, []HeldGPUs{{GPUs: []Range{{0, 7}}, Workers: 8, Nodes: []NodeRun{{"n1", 0}}}}, "count of at least 1"},
		{"empty id", 8, []HeldGPUs{{GPUs: []Range{{0, 7}}, Workers: 8, Nodes: []NodeRun{{"", 1}}}}, "want a node id"},
		{"reversed range", 8, []HeldGPUs{{GPUs: []Range{{7, 0}}, Workers: 8, Nodes: []NodeRun{{"n1", 1}}}}, "held[0].gpus: range [7, 0]"},
		{"negative range", 8, []HeldGPUs{{GPUs: []Range{{-1, 0}}, Workers: 8, Nodes: []NodeRun{{"n1", 1}}}}, "0 <= first"},
		{"too many", 0, []HeldGPUs{{GPUs: []Range{{0, 0}}, Workers: 1, Nodes: []NodeRun{{"n1", maxSummaryNodes + 1}}}}, "over 4194304 nodes"},
		{"no workers", 0, []HeldGPUs{{GPUs: []Range{{0, 0}}, Nodes: []NodeRun{{"n1", 1}}}}, "held[0].workers: 0: want 1 to"},
		{"workers off", 9, []HeldGPUs{{GPUs: []Range{{0, 0}}, Workers: 4, Nodes: []NodeRun{{"n1", 2}}}}, "workers: 9, but its nodes hold 8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Summary{Name: "p", Revision: 2, Workers: c.workers, Held: c.held}
			err := s.Each(func(string, int, []Range) bool { return true })
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "summary of plan p revision 2: ") {
				t.Errorf("error %v, want one with %q", err, c.want)
			}
		})
	}
}

// BenchmarkSummaryOf summarizes a plan of 20,000 8-GPU nodes: 160,000
// one-GPU workers and 240,000 quarter-GPU ones.
func BenchmarkSummaryOf(b *testing.B) {
	var ws []Worker
	for n := range 20000 {
		node := fmt.Sprintf("sim-h100-%d", n+1)
		for g := range 8 {
			if g < 4 {
				ws = append(ws, Worker{Component: Train, NodeID: node, GPUs: []int{g}, GPUShare: 1})
				continue
			}
			for range 3 {
				ws = append(ws, Worker{Component: Env, NodeID: node, GPUs: []int{g}, GPUShare: 0.25})
			}
		}
	}
	var nodes []PoolNode
	for n := range 20000 {
		nodes = append(nodes, PoolNode{NodeID: fmt.Sprintf("sim-h100-%d", n+1)})
	}
	pool := Pool{Name: "all", Nodes: NewPoolNodes(nodes)}
	d := &Document{Header: Header{Name: "default", Revision: 1}, Placement: Placement{Workers: NewWorkers(ws), Pools: []Pool{pool}}}
	for b.Loop() {
		if s := SummaryOf(d, 1); len(s.Held) != 1 {
			b.Fatalf("held %v", s.Held)
		}
	}
}
