package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// storePlannerNames are what package store may name of package planner:
// the types it stores and their parsing, never planning.
var storePlannerNames = []string{"Plan", "ParseSpec", "NameRule"}

// storeForbidden are the packages above store: what answers requests
// (api, service) and what presents (cli, gpumap).
var storeForbidden = []string{"/internal/api", "/internal/service", "/internal/cli", "/internal/gpumap", "/internal/reporter"}

// TestStoreIsPersistence keeps internal/store persistence only: it
// imports no package that answers requests or presents, names of the
// planning core only the types it stores and their parsing
// (storePlannerNames), and exports nothing that handles a request: no
// function or method taking a request of package wire (wire.*Request)
// or making the service's handlers (bus.Handlers). Request handling is
// package api's.
func TestStoreIsPersistence(t *testing.T) {
	files, err := filepath.Glob("../store/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		for _, what := range storePolicy(t, name) {
			t.Errorf("%s: %s", name, what)
		}
	}
}

// storePolicy lists what file name does that package store may not.
func storePolicy(t *testing.T, name string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	local := map[string]string{} // import name -> path
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		n := path.Base(p)
		if imp.Name != nil {
			n = imp.Name.Name
		}
		local[n] = p
		for _, bad := range storeForbidden {
			if p == module+bad {
				out = append(out, "imports "+p+": store is persistence; what needs it belongs in package api or the service")
			}
		}
	}
	pkgOf := func(x ast.Expr) (string, string) {
		sel, ok := x.(*ast.SelectorExpr)
		if !ok {
			return "", ""
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return "", ""
		}
		return local[id.Name], sel.Sel.Name
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if x, ok := n.(ast.Expr); ok {
			if p, sel := pkgOf(x); p == module+"/internal/planner" && !slices.Contains(storePlannerNames, sel) {
				out = append(out, "names planner."+sel+": store may name only "+strings.Join(storePlannerNames, ", ")+" of the planning core")
			}
		}
		return true
	})
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || !fd.Name.IsExported() {
			continue
		}
		var types []ast.Expr
		for _, fl := range []*ast.FieldList{fd.Type.Params, fd.Type.Results} {
			if fl == nil {
				continue
			}
			for _, field := range fl.List {
				types = append(types, field.Type)
			}
		}
		for _, ty := range types {
			if st, ok := ty.(*ast.StarExpr); ok {
				ty = st.X
			}
			p, sel := pkgOf(ty)
			switch {
			case p == module+"/internal/wire" && strings.HasSuffix(sel, "Request"):
				out = append(out, fd.Name.Name+" takes a wire."+sel+": answering requests is package api's")
			case p == module+"/internal/bus" && sel == "Handlers":
				out = append(out, fd.Name.Name+" makes bus.Handlers: answering requests is package api's")
			}
		}
	}
	return out
}

// TestStorePolicyCatches: the rule finds what it forbids in a file made
// to break it, so that TestStoreIsPersistence passing means something.
func TestStorePolicyCatches(t *testing.T) {
	dir := t.TempDir()
	src := `package store

import (
	"context"

	"github.com/poolplanner/poolplanner/internal/api"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
)

var _ = api.Endpoints

func Endpoints() bus.Handlers { return nil }

func Lookup(ctx context.Context, req *wire.LookupRequest) error {
	_, _ = planner.Compute(nil, nil)
	var p *planner.Plan
	_ = p
	return nil
}
`
	name := filepath.Join(dir, "bad.go")
	if err := writeFile(name, src); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(storePolicy(t, name), "\n")
	for _, want := range []string{"imports " + module + "/internal/api", "names planner.Compute", "Endpoints makes bus.Handlers", "Lookup takes a wire.LookupRequest"} {
		if !strings.Contains(got, want) {
			t.Errorf("missed %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "planner.Plan") {
		t.Errorf("planner.Plan is a type store stores, yet:\n%s", got)
	}
}

// writeFile writes src to name, for the tests that check a rule catches
// what it forbids.
func writeFile(name, src string) error { return os.WriteFile(name, []byte(src), 0o600) }
