package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestExamples plans every example spec on the cluster its header names,
// so the examples README.md points at keep working.
func TestExamples(t *testing.T) {
	specs, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(specs) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	clusterRef := regexp.MustCompile(`examples/(cluster[^ ]*\.json)`)
	for _, spec := range specs {
		t.Run(filepath.Base(spec), func(t *testing.T) {
			m := clusterRef.FindSubmatch([]byte(mustRead(t, spec)))
			if m == nil {
				t.Fatalf("%s names no cluster in its header", spec)
			}
			inv := filepath.Join("../../examples", string(m[1]))
			if _, err := os.Stat(inv); err != nil {
				t.Fatal(err)
			}
			for _, out := range []string{"text", "json", "yaml"} {
				if code, _, errOut := run(t, "plan", "--inventory", inv, "--spec", spec, "--output", out); code != 0 {
					t.Errorf("--output %s: exit %d: %s", out, code, errOut)
				}
			}
		})
	}
}
