package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRaceCoversConcurrency keeps .ci/run's race detector run true to the
// code: a package that starts goroutines or takes locks (in its code or in
// its tests, which is where goroutines meet the code under test) is one
// whose data races only -race finds, so it must be named on a `go test
// -race` line; and every package named there must still exist, so the list
// does not rot into names that test nothing.
func TestRaceCoversConcurrency(t *testing.T) {
	const root = "../.."
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	raced := racePatterns(string(script))
	if len(raced) == 0 {
		t.Fatal(".ci/run has no `go test -race` line")
	}
	concurrent, all := concurrentPackages(t, root)
	if len(concurrent) == 0 {
		t.Fatal("found no package with goroutines or locks: the scan is broken")
	}
	for _, dir := range concurrent {
		if !covered(raced, dir) {
			t.Errorf("./%s starts goroutines or uses sync but .ci/run's `go test -race` line does not name it", dir)
		}
	}
	for _, p := range raced {
		dir := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(p, "./"), "..."), "/")
		if dir == "" || dir == "." {
			continue
		}
		if !slices.ContainsFunc(all, func(d string) bool { return d == dir || strings.HasPrefix(d, dir+"/") }) {
			t.Errorf(".ci/run races %s, which holds no Go package", p)
		}
	}
}

func TestRacePatterns(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		want         []string
	}{
		{"one line", "go test -race ./a ./b\n", []string{"./a", "./b"}},
		{"env and flags", "GOFLAGS=-x go test -count=1 -race -timeout 20m ./a/...\n", []string{"./a/..."}},
		{"continued", "go test -race ./a \\\n  ./b \\\n  ./c\necho done ./d\n", []string{"./a", "./b", "./c"}},
		{"comment skipped", "# go test -race ./x\ngo test -race ./a\n", []string{"./a"}},
		{"plain test not counted", "go test ./a\ngo test -race ./b\n", []string{"./b"}},
		{"run filter value", "go test -race -run 'TestA|TestB' ./a\n", []string{"./a"}},
		{"none", "go vet ./...\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := racePatterns(tc.script)
			if !slices.Equal(got, tc.want) {
				t.Errorf("racePatterns = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCovered(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		dir      string
		want     bool
	}{
		{[]string{"./internal/a"}, "internal/a", true},
		{[]string{"./internal/a"}, "internal/a/b", false},
		{[]string{"./internal/a/..."}, "internal/a/b", true},
		{[]string{"./internal/a/..."}, "internal/ab", false},
		{[]string{"./..."}, "client", true},
		{[]string{"./internal/ab"}, "internal/a", false},
	} {
		if got := covered(tc.patterns, tc.dir); got != tc.want {
			t.Errorf("covered(%q, %q) = %v, want %v", tc.patterns, tc.dir, got, tc.want)
		}
	}
}

// raceLine is a shell command that runs go test with the race detector.
var raceLine = regexp.MustCompile(`^\s*(\S+=\S*\s+)*go\s+test\s(.*\s)?-race(\s|$)`)

// racePatterns returns the package patterns (the ./ arguments) of every
// `go test -race` command in a shell script, following backslash
// continuations.
func racePatterns(script string) []string {
	var out []string
	lines := strings.Split(script, "\n")
	for i := 0; i < len(lines); i++ {
		cmd := lines[i]
		for strings.HasSuffix(cmd, "\\") && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, "\\") + " " + lines[i]
		}
		if strings.HasPrefix(strings.TrimSpace(cmd), "#") || !raceLine.MatchString(cmd) {
			continue
		}
		for _, f := range strings.Fields(cmd) {
			if strings.HasPrefix(f, "./") {
				out = append(out, f)
			}
		}
	}
	return out
}

// covered reports whether one of go test's package patterns names the
// package in dir (slash-separated, relative to the module root).
func covered(patterns []string, dir string) bool {
	for _, p := range patterns {
		p = strings.TrimPrefix(p, "./")
		if rest, ok := strings.CutSuffix(p, "..."); ok {
			rest = strings.TrimSuffix(rest, "/")
			if rest == "" || dir == rest || strings.HasPrefix(dir, rest+"/") {
				return true
			}
			continue
		}
		if p == dir {
			return true
		}
	}
	return false
}

// concurrentPackages walks the module under root and returns the
// directories (slash-separated, relative to root) whose Go files are
// concurrent (concurrentFile), and every directory with Go files.
func concurrentPackages(t *testing.T, root string) (concurrent, all []string) {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		if _, ok := seen[dir]; !ok {
			seen[dir] = false
			all = append(all, dir)
		}
		if seen[dir] {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if concurrentFile(f) {
			seen[dir] = true
			concurrent = append(concurrent, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return concurrent, all
}

// concurrentFile reports whether f imports a sync package (the standard
// library's or golang.org/x/sync's, whose errgroup starts goroutines for
// its caller) or starts a goroutine.
func concurrentFile(f *ast.File) bool {
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if p == "sync" || p == "sync/atomic" || strings.HasPrefix(p, "golang.org/x/sync/") {
			return true
		}
	}
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if _, ok := n.(*ast.GoStmt); ok {
			found = true
		}
		return !found
	})
	return found
}

func TestConcurrentFile(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      bool
	}{
		{"sync", "package a\nimport \"sync\"\nvar _ sync.Mutex\n", true},
		{"atomic", "package a\nimport \"sync/atomic\"\nvar _ atomic.Int32\n", true},
		{"go statement", "package a\nfunc f() { go func() {}() }\n", true},
		{"go in a closure", "package a\nvar f = func() { defer func() { go g() }() }\nfunc g() {}\n", true},
		{"channels alone", "package a\nfunc f(c chan int) { c <- 1 }\n", false},
		{"go in a string", "package a\nconst s = \"go func() {}\"\n", false},
		{"errgroup", "package a\nimport \"golang.org/x/sync/errgroup\"\nvar _ errgroup.Group\n", true},
		{"a package named like sync", "package a\nimport \"example.com/sync\"\nvar _ sync.T\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parser.ParseFile(token.NewFileSet(), "a.go", tc.src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if got := concurrentFile(f); got != tc.want {
				t.Errorf("concurrentFile = %v, want %v", got, tc.want)
			}
		})
	}
}
