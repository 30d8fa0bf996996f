package cli

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestJSEngines: examples/js asks for a node every locked package
// accepts (npm warns EBADENGINE otherwise): its engines.node, in
// package.json and the lockfile, is at least each package's minimum.
func TestJSEngines(t *testing.T) {
	minMajor := regexp.MustCompile(`^>=\s*(\d+)`)
	major := func(spec string) int {
		m := minMajor.FindStringSubmatch(spec)
		if m == nil {
			t.Fatalf("engines.node %q: not a >= N form this test reads", spec)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	var pkg struct {
		Engines struct{ Node string } `json:"engines"`
	}
	data, err := os.ReadFile("../../examples/js/package.json")
	if err != nil || json.Unmarshal(data, &pkg) != nil {
		t.Fatalf("package.json: %v", err)
	}
	var lock struct {
		Packages map[string]struct {
			Engines struct{ Node string } `json:"engines"`
		} `json:"packages"`
	}
	data, err = os.ReadFile("../../examples/js/package-lock.json")
	if err != nil || json.Unmarshal(data, &lock) != nil {
		t.Fatalf("package-lock.json: %v", err)
	}
	ours := major(pkg.Engines.Node)
	if root := lock.Packages[""].Engines.Node; root != pkg.Engines.Node {
		t.Errorf("the lockfile's engines.node %q differs from package.json's %q", root, pkg.Engines.Node)
	}
	for name, p := range lock.Packages {
		if name != "" && p.Engines.Node != "" && major(p.Engines.Node) > ours {
			t.Errorf("%s needs node %s; examples/js declares %s", name, p.Engines.Node, pkg.Engines.Node)
		}
	}
}
