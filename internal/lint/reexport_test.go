// Package lint holds tests over the source of other packages.
package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoReexports keeps one name per concept: no exported type alias of
// another package's type, and no exported const or var that is another
// package's name again. Callers name the package that defines it.
func TestNoReexports(t *testing.T) {
	for _, dir := range []string{"../../client", "../bus", "../planner", "../store", "../wire", "../service", "../api", "../../plan"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			for _, what := range reexports(t, name) {
				t.Errorf("%s: %s", name, what)
			}
		}
	}
}

const module = "github.com/poolplanner/poolplanner"

// reexports lists the exported names of file name that merely rename
// another package's.
func reexports(t *testing.T, name string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]bool{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if !strings.HasPrefix(p, module+"/") {
			continue // time.Second is a value, not a name of ours again
		}
		n := path.Base(p)
		if imp.Name != nil {
			n = imp.Name.Name
		}
		imported[n] = true
	}
	// other is x when x is a name of one of our packages.
	other := func(x ast.Expr) bool {
		sel, ok := x.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && imported[id.Name]
	}
	var out []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range gd.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() && s.Assign.IsValid() && other(s.Type) {
					out = append(out, "type "+s.Name.Name+" is an alias of another package's type")
				}
			case *ast.ValueSpec:
				for i, n := range s.Names {
					if n.IsExported() && i < len(s.Values) && other(s.Values[i]) {
						out = append(out, n.Name+" is another package's name again")
					}
				}
			}
		}
	}
	return out
}
