package bus

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNoPolicy keeps bus the NATS plumbing: what is stored and the
// policy over it (plans, inventories, lookups) are package store's and
// the service's, so bus imports neither the planner nor the inventory.
func TestImportsNoPolicy(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"/internal/planner", "/internal/inventory", "/internal/store", "/internal/service"}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if strings.HasSuffix(path, bad) {
					t.Errorf("%s imports %s: bus is NATS plumbing; what needs %s belongs in package store or the service", name, path, bad)
				}
			}
		}
	}
}
