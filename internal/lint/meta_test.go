package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// metaFields are the fields of client.Meta, a revision's one metadata
// type, besides Seq: a struct with Seq and any of them says again what
// Meta says, and should embed Meta instead.
var metaFields = []string{"Base", "SpecDigest", "Publisher"}

// TestOneRevisionMetadata keeps one revision metadata type: no struct
// type of the module but client.Meta declares Seq (a stream sequence)
// together with a revision's base, spec digest or publisher. The store's
// revisions and the client's embed client.Meta. A document written for
// readers outside (every field JSON-tagged: planner history --output
// json's entries) is left alone: its keys are what those readers rely
// on, and it is rendered from Meta at the edge.
func TestOneRevisionMetadata(t *testing.T) {
	root := "../.."
	err := filepath.WalkDir(root, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if base := d.Name(); name != root && (strings.HasPrefix(base, ".") || base == "testdata" || base == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, name)
		for _, what := range metadataRepeats(t, name, filepath.ToSlash(rel)) {
			t.Errorf("%s: %s", rel, what)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// metadataRepeats lists the structs of file name (rel, from the module
// root) that repeat a revision's metadata.
func metadataRepeats(t *testing.T, name, rel string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok || rel == "client/meta.go" && ts.Name.Name == "Meta" {
			return true
		}
		var names []string
		tagged := true
		for _, field := range st.Fields.List {
			for _, id := range field.Names {
				names = append(names, id.Name)
			}
			tagged = tagged && field.Tag != nil && strings.Contains(field.Tag.Value, `json:"`)
		}
		if tagged || !slices.Contains(names, "Seq") {
			return true
		}
		for _, m := range metaFields {
			if slices.Contains(names, m) {
				out = append(out, "struct "+ts.Name.Name+" has Seq and "+m+": a revision's metadata is client.Meta; embed it")
				break
			}
		}
		return true
	})
	return out
}

// TestOneRevisionMetadataCatches: the rule finds a second metadata
// type, and leaves client.Meta, a sequence alone and a document for
// outside readers alone.
func TestOneRevisionMetadataCatches(t *testing.T) {
	dir := t.TempDir()
	src := `package x

type Revision struct {
	Seq        uint64
	SpecDigest string
}

type Entry struct {
	Seq       uint64 ` + "`json:\"seq\"`" + `
	Publisher string ` + "`json:\"publisher\"`" + `
}

type Assignment struct {
	Seq    uint64
	NodeID string
}

type Meta struct {
	Seq  uint64
	Base int
}
`
	name := filepath.Join(dir, "x.go")
	if err := writeFile(name, src); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(metadataRepeats(t, name, "x/x.go"), "\n")
	for _, want := range []string{"struct Revision has Seq and SpecDigest", "struct Meta has Seq and Base"} {
		if !strings.Contains(got, want) {
			t.Errorf("missed %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Assignment") || strings.Contains(got, "Entry") {
		t.Errorf("a sequence alone, or a document for outside readers, is no metadata type, yet:\n%s", got)
	}
	if got := metadataRepeats(t, "../../client/meta.go", "client/meta.go"); len(got) > 0 {
		t.Errorf("client.Meta itself: %v", got)
	}
}
