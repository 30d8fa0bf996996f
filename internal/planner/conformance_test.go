package planner

import (
	"encoding/json"
	"fmt"
	"github.com/poolplanner/poolplanner/plan"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// confCase is one recorded case of testdata/conformance (copied from the
// shared conformance suite; see its README for the classes).
type confCase struct {
	Name    string `json:"name"`
	Class   string `json:"class"`
	Cluster map[string]struct {
		IP  string  `json:"ip"`
		CPU float64 `json:"CPU"`
		GPU int     `json:"GPU"`
	} `json:"cluster"`
	Scheduling   json.RawMessage `json:"scheduling"`
	Placement    json.RawMessage `json:"placement"`
	ResourcePool json.RawMessage `json:"resource_pool"`
	Expect       struct {
		Error                 string                       `json:"error"`
		ResourcePool          []map[string]json.RawMessage `json:"resource_pool"`
		Workers               map[string][][3]any          `json:"workers"`
		StorageToTrainWorkers map[string][]int             `json:"storage_to_train_workers"`
	} `json:"expect"`
}

func (c *confCase) nodes() []Node {
	var nodes []Node
	for id, r := range c.Cluster {
		nodes = append(nodes, Node{ID: id, IP: r.IP, CPUs: r.CPU, GPUs: r.GPU})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes
}

func (c *confCase) spec(t testing.TB, pools json.RawMessage, placement string) *Spec {
	doc := map[string]json.RawMessage{"scheduling": c.Scheduling, "placement": c.Placement}
	if placement != "" {
		doc["placement"] = json.RawMessage(placement)
	}
	if len(pools) > 0 && string(pools) != "null" {
		doc["resource_pool"] = pools
	}
	b, _ := json.Marshal(doc)
	s, err := ParseSpec(b)
	if err != nil {
		t.Fatalf("%s: spec: %v", c.Name, err)
	}
	return s
}

func loadCases(t testing.TB, file string) []confCase {
	data, err := os.ReadFile(filepath.Join("testdata", "conformance", file))
	if err != nil {
		t.Fatal(err)
	}
	var cases []confCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

var insufficient = regexp.MustCompile(`Insufficient (GPUs|CPUs): required ([\d.]+), available ([\d.]+)`)

func TestConformance(t *testing.T) {
	for _, file := range []string{"rlightning-cases.json", "beyond-cases.json"} {
		classes := map[string]int{}
		for _, c := range loadCases(t, file) {
			classes[c.Class]++
			t.Run(c.Name, func(t *testing.T) {
				nodes := c.nodes()
				spec := c.spec(t, c.ResourcePool, "")
				p, err := Compute(spec, nodes)
				if c.Class == "reject" {
					checkReject(t, &c, p, err)
					return
				}
				if err != nil || !p.Valid() {
					t.Fatalf("no valid plan: %v", err)
				}
				for _, e := range checkPlan(spec, nodes, p) {
					t.Error(e)
				}
				if c.Class == "exact" {
					checkExact(t, &c, p)
				}
				// Loading the plan's own resource_pool in manual mode gives
				// the same allocations.
				rp, _ := json.Marshal(p.ResourcePool)
				p2, err := Compute(c.spec(t, rp, `{"mode": "manual"}`), nodes)
				if err != nil {
					t.Fatalf("round trip: %v", err)
				}
				if fmt.Sprint(allocSet(p2)) != fmt.Sprint(allocSet(p)) {
					t.Errorf("round trip: other allocations")
				}
			})
		}
		if classes["exact"]+classes["improve"]+classes["reject"] == 0 {
			t.Fatalf("%s: no cases", file)
		}
	}
}

func checkReject(t *testing.T, c *confCase, p *Plan, err error) {
	if err == nil || p.Valid() {
		t.Fatalf("valid plan, want a refusal")
	}
	if strings.TrimSpace(p.Error) == "" {
		t.Fatalf("empty error")
	}
	if m := insufficient.FindStringSubmatch(c.Expect.Error); m != nil {
		if !strings.Contains(p.Error, "Insufficient "+m[1]) {
			t.Errorf("error %q does not say Insufficient %s", p.Error, m[1])
		}
		if got := regexp.MustCompile(`available ([\d.]+)`).FindStringSubmatch(p.Error); got == nil || got[1] != m[3] {
			t.Errorf("error %q, want available %s", p.Error, m[3])
		}
	}
	if strings.Contains(c.Expect.Error, "node_ids") && p.Error != ErrMixedNodesNeedIDs {
		t.Errorf("error %q, want %q", p.Error, ErrMixedNodesNeedIDs)
	}
}

func checkExact(t *testing.T, c *confCase, p *Plan) {
	norm := func(name string, numNode int, numGPUs any, idx map[string]string) string {
		if l, ok := numGPUs.([]any); ok && len(l) > 0 {
			same := true
			for _, x := range l {
				same = same && fmt.Sprint(x) == fmt.Sprint(l[0])
			}
			if same {
				numGPUs = l[0]
			}
		}
		keys := make([]string, 0, len(idx))
		for k, v := range idx {
			rs, _ := plan.ParseIndexString(v)
			keys = append(keys, k+"="+plan.FormatRanges(rs))
		}
		sort.Strings(keys)
		return fmt.Sprintf("%s/%d/%v/%s", name, numNode, numGPUs, strings.Join(keys, ";"))
	}
	var want, got []string
	for _, e := range c.Expect.ResourcePool {
		var name string
		var numNode int
		var numGPUs any
		idx := map[string]string{}
		for k, v := range e {
			switch k {
			case "name":
				_ = json.Unmarshal(v, &name)
			case "num_node":
				_ = json.Unmarshal(v, &numNode)
			case "num_gpus":
				_ = json.Unmarshal(v, &numGPUs)
			case "node_ids":
			default:
				var s any
				_ = json.Unmarshal(v, &s)
				idx[k] = fmt.Sprint(s)
			}
		}
		if numNode > 0 {
			want = append(want, norm(name, numNode, numGPUs, idx))
		}
	}
	for _, e := range p.ResourcePool {
		idx := map[string]string{}
		for _, ci := range e.Indices {
			idx[string(ci.Component)] = ci.Index
		}
		var numGPUs any = float64(e.NumGPUs[0])
		if len(e.NumGPUs) > 1 {
			l := []any{}
			for _, g := range e.NumGPUs {
				l = append(l, float64(g))
			}
			numGPUs = l
		}
		got = append(got, norm(e.Name, e.NumNode, numGPUs, idx))
	}
	sort.Strings(want)
	sort.Strings(got)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("resource_pool\n got %v\nwant %v", got, want)
	}
	byComp := map[string][]string{}
	for _, w := range p.Workers.Slice() {
		var first any
		if w.Component != plan.Buffer && len(w.GPUs) > 0 {
			first = float64(w.GPUs[0])
		}
		byComp[string(w.Component)] = append(byComp[string(w.Component)], fmt.Sprint([3]any{w.Pool, w.NodeID, first}))
	}
	for comp, locs := range c.Expect.Workers {
		var w []string
		for _, l := range locs {
			w = append(w, fmt.Sprint(l))
		}
		if fmt.Sprint(byComp[comp]) != fmt.Sprint(w) {
			t.Errorf("%s workers\n got %v\nwant %v", comp, byComp[comp], w)
		}
	}
	if fmt.Sprint(normS2T(p.StorageToTrainWorkers)) != fmt.Sprint(normS2T(c.Expect.StorageToTrainWorkers)) {
		t.Errorf("storage_to_train_workers %v, want %v", p.StorageToTrainWorkers, c.Expect.StorageToTrainWorkers)
	}
}

func normS2T(m map[string][]int) map[string][]int {
	out := map[string][]int{}
	for k, v := range m {
		v = append([]int(nil), v...)
		sort.Ints(v)
		out[k] = v
	}
	return out
}
