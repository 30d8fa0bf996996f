package planner

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestNameRule(t *testing.T) {
	errKind := errors.New("kind")
	plain := NameRule{Kind: "plan name", Max: 8, Punct: "-_=", Err: errKind}
	dotted := NameRule{Kind: "node id", Max: 8, Punct: "-_=/", Dots: true}
	for _, c := range []struct {
		rule NameRule
		name string
		want string // "" valid
	}{
		{plain, "default", ""},
		{plain, "a-b_c=D9", ""},
		{plain, "", `invalid plan name "": empty; want 1 to 8 bytes of ASCII letters, digits and - _ =`},
		{plain, "abcdefghi", `invalid plan name "abcdefghi": 9 bytes is too long; want 1 to 8 bytes`},
		{plain, "a.b", `'.' at byte 1 is not allowed`},
		{plain, "a b", `' ' at byte 1 is not allowed`},
		{plain, "a*", `'*' at byte 1 is not allowed`},
		{plain, "a>", `'>' at byte 1 is not allowed`},
		{plain, "a/b", `'/' at byte 1 is not allowed`},
		{plain, "aü", `'ü' at byte 1 is not allowed`},
		{plain, "a\xff", `byte 0xff at byte 1 is not allowed`},
		{plain, "a\tb", `'\t' at byte 1 is not allowed`},
		{dotted, "n1", ""},
		{dotted, "a.b/c=d", ""},
		{dotted, ".a", `'.' at byte 0 is not allowed; want 1 to 8 bytes of ASCII letters, digits and - _ = / . (a dot neither first, last nor next to another)`},
		{dotted, "a.", `'.' at byte 1 is not allowed`},
		{dotted, "a..b", `'.' at byte 1 is not allowed`},
	} {
		err := c.rule.Check(c.name)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %q: %v", c.rule.Kind, c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %q: %v, want %q", c.rule.Kind, c.name, err, c.want)
		case err != nil && c.rule.Err != nil && !errors.Is(err, c.rule.Err):
			t.Errorf("%s %q: %v does not wrap the rule's error", c.rule.Kind, c.name, err)
		}
	}
}

// TestNameRuleProperties: Check accepts exactly the names of the rule's
// regular expression, and its error, however long the name, is short
// and names the kind and the rule.
func TestNameRuleProperties(t *testing.T) {
	rules := []struct {
		rule NameRule
		re   *regexp.Regexp
	}{
		{NameRule{Kind: "plan name", Max: 64, Punct: "-_="}, regexp.MustCompile(`^[-_=A-Za-z0-9]+$`)},
		{NameRule{Kind: "node id", Max: 253, Punct: "-_=/", Dots: true}, regexp.MustCompile(`^[-_=/A-Za-z0-9]+(\.[-_=/A-Za-z0-9]+)*$`)},
		{LabelKeyRule, regexp.MustCompile(`^[-_/A-Za-z0-9]+(\.[-_/A-Za-z0-9]+)*$`)},
	}
	rapid.Check(t, func(t *rapid.T) {
		r := rapid.SampledFrom(rules).Draw(t, "rule")
		name := rapid.OneOf(
			rapid.String(),
			rapid.StringOfN(rapid.SampledFrom([]rune("aZ09-_=/.* >\tü")), 0, 300, -1),
			rapid.Custom(func(t *rapid.T) string {
				return strings.Repeat("n", rapid.IntRange(r.rule.Max-2, r.rule.Max+2).Draw(t, "len"))
			}),
		).Draw(t, "name")
		want := len(name) <= r.rule.Max && r.re.MatchString(name)
		err := r.rule.Check(name)
		if (err == nil) != want {
			t.Fatalf("Check(%q) = %v; want valid %v", name, err, want)
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "invalid "+r.rule.Kind+" ") || !strings.HasSuffix(msg, r.rule.String()) || len(msg) > 120+len(r.rule.String()) {
				t.Fatalf("Check(%q): %q", name, msg)
			}
		}
	})
}

// TestNodeSelectorKeys: node_selector's keys follow LabelKeyRule; a
// broken one is a FieldError naming the field, the key and the rule.
func TestNodeSelectorKeys(t *testing.T) {
	spec := func(sel string) []byte {
		return []byte("scheduling: {train: {worker_num: 1, num_cpus: 1, num_gpus: 1, node_selector: " + sel + "}}\n")
	}
	for _, c := range []struct {
		sel, want string
	}{
		{`{zone: a, nvidia.com/gpu.clique: r1, topology.kubernetes.io/zone: b}`, ""},
		{`{"` + strings.Repeat("k", 253) + `": v}`, ""},
		{`{"` + strings.Repeat("k", 254) + `": v}`, `scheduling.train.node_selector: invalid label key "kkkk`},
		{`{"` + strings.Repeat("k", 1000) + `": v}`, `(1000 bytes): 1000 bytes is too long; want 1 to 253 bytes`},
		{`{"a b": v}`, `scheduling.train.node_selector: invalid label key "a b": ' ' at byte 1 is not allowed`},
		{`{"a=b": v}`, `'=' at byte 1 is not allowed`},
		{`{"": v}`, `invalid label key "": empty`},
		{`{zone: "` + strings.Repeat("v", 257) + `"}`, "scheduling.train.node_selector.zone: "},
	} {
		_, err := ParseSpec(spec(c.sel))
		var fe *FieldError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%.60s: %v", c.sel, err)
		case c.want != "" && (!errors.As(err, &fe) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%.60s: %v, want a FieldError with %q", c.sel, err, c.want)
		case err != nil && len(err.Error()) > 400:
			t.Errorf("%.60s: an error of %d bytes", c.sel, len(err.Error()))
		}
	}
}
