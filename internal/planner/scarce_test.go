package planner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scarceCase is a case of testdata/constraints: the conformance suite's
// shape (name, class, scheduling, placement, expect), with nodes that
// say their GPU model, NUMA nodes, NVLink, labels and domain. improve: a
// valid plan exists and must be found, keeping every constraint; reject:
// none exists, and the error names the component and the constraint.
type scarceCase struct {
	Name       string          `json:"name"`
	Class      string          `json:"class"`
	Note       string          `json:"note"`
	Nodes      []nodeGroup     `json:"nodes"`
	Scheduling json.RawMessage `json:"scheduling"`
	Placement  json.RawMessage `json:"placement"`
	Expect     struct {
		// Error holds what the error must say, each part in turn.
		Error []string `json:"error"`
	} `json:"expect"`
}

// nodeGroup is nodes alike but for their ids.
type nodeGroup struct {
	IDs       []string          `json:"ids"`
	Model     string            `json:"model"`
	GPUs      int               `json:"gpus"`
	CPUs      float64           `json:"cpus"`
	MemoryMiB uint64            `json:"memory_mib"`
	NUMA      []int             `json:"numa"`
	NVLink    bool              `json:"nvlink"`
	Labels    map[string]string `json:"labels"`
	Domain    string            `json:"domain"`
}

func (ng nodeGroup) nodes() []Node {
	var out []Node
	for _, id := range ng.IDs {
		n := Node{ID: id, IP: "10.0.0.1", CPUs: ng.CPUs, GPUs: ng.GPUs, Labels: ng.Labels, Domain: ng.Domain, NUMA: ng.NUMA}
		for g := range ng.GPUs {
			n.Models = append(n.Models, ng.Model)
			n.MemoryBytes = append(n.MemoryBytes, ng.MemoryMiB<<20)
			var peers uint64
			if ng.NVLink {
				peers = (1<<ng.GPUs - 1) &^ (1 << g)
			}
			n.Peers = append(n.Peers, peers)
		}
		out = append(out, n)
	}
	return out
}

func loadScarceCases(t *testing.T) []scarceCase {
	data, err := os.ReadFile(filepath.Join("testdata", "constraints", "scarce-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []scarceCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestScarceModels: on mixed clusters whose scarce nodes sort first, a
// plan is found whenever one exists (unconstrained groups leave the
// scarce nodes to the groups that need them; a strict group binds only
// itself), and an impossible spec names the component and the
// constraint that binds, not the occupancy a greedy pass left.
func TestScarceModels(t *testing.T) {
	for _, c := range loadScarceCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			var nodes []Node
			for _, ng := range c.Nodes {
				nodes = append(nodes, ng.nodes()...)
			}
			doc, _ := json.Marshal(map[string]json.RawMessage{"scheduling": c.Scheduling, "placement": c.Placement})
			spec, err := ParseSpec(doc)
			if err != nil {
				t.Fatalf("spec: %v", err)
			}
			p, err := Compute(spec, nodes)
			switch c.Class {
			case "improve":
				if err != nil || !p.Valid() {
					t.Fatalf("no valid plan: %v", err)
				}
				for _, e := range checkPlan(spec, nodes, p) {
					t.Error(e)
				}
				checkConstraints(t, spec, nodes, p)
				exportLoadsBack(t, spec, nodes, p)
			case "reject":
				if err == nil || p.Valid() {
					t.Fatalf("valid plan, want a refusal")
				}
				rest := p.Error
				for _, part := range c.Expect.Error {
					i := strings.Index(rest, part)
					if i < 0 {
						t.Fatalf("error %q\nwant it to say, in turn, %q", p.Error, c.Expect.Error)
					}
					rest = rest[i+len(part):]
				}
				if Validate(spec, nodes) == nil {
					t.Error("Validate accepts what Compute refuses")
				}
			default:
				t.Fatalf("class %q", c.Class)
			}
		})
	}
}
