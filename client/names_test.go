package client

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxNames bounds what package client shows a launcher (the lines of
// `go doc -short`): the client, what its methods take and return, and
// the contract's names. Wire helpers belong in internal/wire.
const maxNames = 30

// TestFewNames counts the package's top-level names as `go doc -short`
// lists them: a const or var block, a func, a type and each of its
// constructors, one line each.
func TestFewNames(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	pkg, err := doc.NewFromFiles(fset, parsed, "github.com/poolplanner/poolplanner/client")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, v := range append(pkg.Consts, pkg.Vars...) {
		lines = append(lines, strings.Join(v.Names, ","))
	}
	for _, f := range pkg.Funcs {
		lines = append(lines, f.Name)
	}
	for _, typ := range pkg.Types {
		lines = append(lines, typ.Name)
		for _, v := range append(typ.Consts, typ.Vars...) {
			lines = append(lines, strings.Join(v.Names, ","))
		}
		for _, f := range typ.Funcs {
			lines = append(lines, f.Name)
		}
	}
	if len(lines) > maxNames {
		t.Errorf("package client shows %d names, over %d: %s", len(lines), maxNames, strings.Join(lines, " "))
	}
}

func TestPlanEventSubject(t *testing.T) {
	if got := PlanEventSubject("default"); got != "poolplanner.plans.default" {
		t.Errorf("got %q", got)
	}
}
