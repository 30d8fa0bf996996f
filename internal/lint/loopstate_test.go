package lint

import (
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLoopStateOwned keeps the service's loop state its loop's alone
// (internal/service, loop.go): no type but the loop holds the loop
// state (loopState), even through other types' fields, and no function
// names it but the loop state's and the loop's methods, loop.go's
// functions, and the two that make one and hand it to the loop's
// goroutine (New, for the first snapshot, and Service.Run). A request
// handler, a method of Service, then cannot read or write what the loop
// writes without a lock: it reads the snapshot the loop publishes.
func TestLoopStateOwned(t *testing.T) {
	fset, files, info, pkg := typeCheck(t, "../service")
	for _, leak := range loopStateLeaks(fset, files, info, pkg) {
		t.Error(leak)
	}
}

// TestLoopStateLeaksFound: the check finds each kind of leak in a
// package made of them (testdata/loopstate), so that it cannot pass by
// finding nothing.
func TestLoopStateLeaksFound(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("testdata", "loopstate", "leaks.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := newInfo()
	pkg, err := (&types.Config{}).Check("leaks", fset, []*ast.File{f}, info)
	if err != nil {
		t.Fatal(err)
	}
	got := loopStateLeaks(fset, []*ast.File{f}, info, pkg)
	for _, want := range []string{
		"type Service reaches the loop state (field st)",
		"type gpuMap reaches the loop state (field l)",
		"var global names the loop state",
		"func (*Service).handler names the loop state",
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("not found: %s; found:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if len(got) != 4 {
		t.Errorf("found %d leaks, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}
}

func newInfo() *types.Info {
	return &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
}

// typeCheck type-checks the package in dir (its files but tests), its
// imports read from the export data go list makes.
func typeCheck(t *testing.T, dir string) (*token.FileSet, []*ast.File, *types.Info, *types.Package) {
	t.Helper()
	out, err := exec.Command(goTool(), "list", "-export", "-deps", "-json=ImportPath,Export,Dir,GoFiles", dir).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", dir, err)
	}
	type listed struct {
		ImportPath, Export, Dir string
		GoFiles                 []string
	}
	exports := map[string]string{}
	var self listed
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list %s: %v", dir, err)
		}
		exports[p.ImportPath] = p.Export
		self = p // -deps lists the package itself last
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	info := newInfo()
	pkg, err := (&types.Config{Importer: imp}).Check(self.ImportPath, fset, files, info)
	if err != nil {
		t.Fatalf("type-check %s: %v", self.ImportPath, err)
	}
	return fset, files, info, pkg
}

// goTool is the go command of the toolchain running the test.
func goTool() string {
	if p := filepath.Join(os.Getenv("GOROOT"), "bin", "go"); os.Getenv("GOROOT") != "" {
		return p
	}
	return "go"
}

// loopStateLeaks lists where pkg's loop state (loopState) is held or
// named beyond the loop, as TestLoopStateOwned has it.
func loopStateLeaks(fset *token.FileSet, files []*ast.File, info *types.Info, pkg *types.Package) []string {
	obj := pkg.Scope().Lookup("loopState")
	if obj == nil {
		return []string{pkg.Path() + " has no type loopState"}
	}
	state := obj.Type()
	var out []string
	// reaches says whether t holds the loop state, through the package's
	// own types' fields too.
	var reaches func(t types.Type, seen map[types.Type]bool) bool
	reaches = func(t types.Type, seen map[types.Type]bool) bool {
		if types.Identical(t, state) {
			return true
		}
		if seen[t] {
			return false
		}
		seen[t] = true
		switch t := t.(type) {
		case *types.Named:
			return t.Obj().Pkg() == pkg && reaches(t.Underlying(), seen)
		case *types.Pointer:
			return reaches(t.Elem(), seen)
		case *types.Slice:
			return reaches(t.Elem(), seen)
		case *types.Array:
			return reaches(t.Elem(), seen)
		case *types.Chan:
			return reaches(t.Elem(), seen)
		case *types.Map:
			return reaches(t.Key(), seen) || reaches(t.Elem(), seen)
		case *types.Signature:
			return reaches(t.Params(), seen) || reaches(t.Results(), seen)
		case *types.Tuple:
			for v := range t.Variables() {
				if reaches(v.Type(), seen) {
					return true
				}
			}
		case *types.Struct:
			for f := range t.Fields() {
				if reaches(f.Type(), seen) {
					return true
				}
			}
		}
		return false
	}
	// The loop holds it, and the loop state embeds the Service (which
	// must not reach back).
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || name == "loop" || name == "loopState" {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for f := range st.Fields() {
			if reaches(f.Type(), map[types.Type]bool{}) {
				out = append(out, "type "+name+" reaches the loop state (field "+f.Name()+")")
			}
		}
	}
	names := func(n ast.Node) bool {
		found := false
		ast.Inspect(n, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok || found {
				return !found
			}
			o := info.Uses[id]
			if o == nil {
				o = info.Defs[id]
			}
			if o != nil && o.Type() != nil && reaches(o.Type(), map[types.Type]bool{}) {
				found = true
			}
			return true
		})
		return found
	}
	for _, f := range files {
		loopFile := filepath.Base(fset.Position(f.Pos()).Filename) == "loop.go"
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				if d.Tok != token.VAR {
					continue
				}
				for _, s := range d.Specs {
					for _, n := range s.(*ast.ValueSpec).Names {
						if o := info.Defs[n]; o != nil && reaches(o.Type(), map[types.Type]bool{}) {
							out = append(out, fset.Position(n.Pos()).String()+": var "+n.Name+" names the loop state")
						}
					}
				}
			case *ast.FuncDecl:
				name, recv := d.Name.Name, ""
				if d.Recv != nil && len(d.Recv.List) == 1 {
					recv = types.ExprString(d.Recv.List[0].Type)
				}
				switch {
				case recv == "*loopState" || recv == "*loop" || loopFile && recv == "":
					continue // the loop's
				case recv == "" && name == "New" || recv == "*Service" && name == "Run":
					continue // they hand the loop state to the loop's goroutine
				}
				if names(d) {
					what := name
					if recv != "" {
						what = "(" + recv + ")." + name
					}
					out = append(out, fset.Position(d.Pos()).String()+": func "+what+" names the loop state")
				}
			}
		}
	}
	return out
}
