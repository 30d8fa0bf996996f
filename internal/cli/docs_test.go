package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsReferencesResolve: every file README.md, subjects.md and the
// compose files point at (a markdown link, or a path in backquotes under
// one of the repository's folders) is in the repository.
func TestDocsReferencesResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)`)
	path := regexp.MustCompile("(?:^|[\\s`(])((?:examples|internal|cmd|deploy|docs|client|plan|\\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")
	for _, doc := range []string{"README.md", "subjects.md", "docker-compose.yaml", "docker-compose.ha.yaml", "deploy/nats.conf", "deploy/nats-cluster.conf"} {
		data, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatal(err)
		}
		var refs []string
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			if !strings.Contains(m[1], "://") {
				refs = append(refs, m[1])
			}
		}
		for _, m := range path.FindAllStringSubmatch(string(data), -1) {
			refs = append(refs, m[1])
		}
		for _, ref := range refs {
			ref = strings.TrimSuffix(ref, ".")
			if i := strings.LastIndex(ref, "/"); i >= 0 {
				// A Go name in a package (internal/inventory.NodeInventory):
				// the package's folder.
				if j := strings.Index(ref[i:], "."); j > 0 && i+j+1 < len(ref) && ref[i+j+1] >= 'A' && ref[i+j+1] <= 'Z' {
					ref = ref[:i+j]
				}
			}
			if strings.ContainsAny(ref, "*{}") || strings.Contains(ref, "...") {
				continue
			}
			if _, err := os.Stat(filepath.Join("../..", ref)); err != nil {
				t.Errorf("%s points at %s, which is not in the repository", doc, ref)
			}
		}
	}
}
