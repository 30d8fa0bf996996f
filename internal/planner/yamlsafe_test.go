package planner

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestParseSpecDuplicateKeys: a key given twice is refused, as a
// FieldError naming the mapping and both places, at any depth, in YAML
// and in JSON.
func TestParseSpecDuplicateKeys(t *testing.T) {
	for _, c := range []struct{ name, spec, err string }{
		{"top level yaml", "scheduling: {}\nplacement: {mode: auto}\nscheduling: {}\n",
			`spec: key "scheduling" appears twice (lines 1 and 3); give each key once`},
		{"top level json", `{"scheduling": {}, "scheduling": {}}`,
			`spec: key "scheduling" appears twice (line 1, columns 2 and 20); give each key once`},
		{"top level json, lines", "{\n  \"placement\": {},\n  \"scheduling\": {},\n  \"placement\": {}\n}",
			`spec: key "placement" appears twice (lines 2 and 4); give each key once`},
		{"scheduling yaml", "scheduling:\n  train: {worker_num: 1}\n  eval: {worker_num: 1}\n  train: {worker_num: 2}\n",
			`scheduling: key "train" appears twice (lines 2 and 4); give each key once`},
		{"scheduling json", `{"scheduling": {"train": {"worker_num": 1}, "train": {"worker_num": 2}}}`,
			`scheduling: key "train" appears twice (line 1, columns 17 and 45); give each key once`},
		{"env item yaml", "scheduling:\n  env:\n    - {worker_num: 1}\n    - worker_num: 1\n      num_gpus: 1\n      worker_num: 2\n",
			`scheduling.env[1]: key "worker_num" appears twice (lines 4 and 6); give each key once`},
		{"env item json", `{"scheduling": {"env": [{"worker_num": 1, "num_gpus": 0.5, "worker_num": 1}]}}`,
			`scheduling.env[0]: key "worker_num" appears twice (line 1, columns 26 and 60); give each key once`},
		{"node selector", "scheduling:\n  train:\n    worker_num: 1\n    node_selector: {zone: a, zone: b}\n",
			`scheduling.train.node_selector: key "zone" appears twice (line 4, columns 21 and 30); give each key once`},
		{"worker counts", "resource_pool:\n  - name: p\n    worker_counts:\n      train: [1]\n      train: [2]\n",
			`resource_pool[0].worker_counts: key "train" appears twice (lines 4 and 5); give each key once`},
		{"quoted and plain", "placement: {mode: auto, \"mode\": manual}\n",
			`placement: key "mode" appears twice (line 1, columns 13 and 25); give each key once`},
		{"merge key twice", "scheduling: {}\n<<: {a: 1}\n<<: {b: 1}\n",
			`spec: key "<<" appears twice (lines 2 and 3); give each key once`},
		{"merge key and quoted <<", "<<: {a: 1}\n\"<<\": 1\n",
			`spec: key "<<" appears twice (lines 1 and 2); give each key once`},
		{"alias key", "placement: {&m mode: auto, *m : manual}\n",
			`placement: key "mode" appears twice (line 1, columns 13 and 28); give each key once`},
		{"long key", `{"` + strings.Repeat("x", 100) + `": 1, "` + strings.Repeat("x", 100) + `": 2}`,
			`spec: key "` + strings.Repeat("x", 64) + `…" appears twice (line 1, columns 2 and 109); give each key once`},
		{"within a merged mapping", "base: &b {a: 1, a: 2}\nscheduling: {<<: *b}\n",
			`base: key "a" appears twice (line 1, columns 11 and 17); give each key once`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.spec))
			var fe *FieldError
			if err == nil || !errors.As(err, &fe) || err.Error() != c.err {
				t.Fatalf("got %v (%T), want FieldError %q", err, err, c.err)
			}
			if _, err := DecodeYAML([]byte(c.spec)); err == nil || err.Error() != c.err {
				t.Fatalf("DecodeYAML: got %v, want %q", err, c.err)
			}
		})
	}
}

// TestParseSpecManyDuplicateKeys: the request of the issue, 40,000 copies
// of one key (240 KB), is refused at the second copy.
func TestParseSpecManyDuplicateKeys(t *testing.T) {
	for _, n := range []int{3_000, 40_000} {
		_, err := ParseSpec(jsonKeys(n, true))
		want := `spec: key "a" appears twice (line 1, columns 2 and 8); give each key once`
		if err == nil || err.Error() != want {
			t.Fatalf("%d keys: got %v, want %q", n, err, want)
		}
	}
	// Distinct keys decode, all of them.
	v, err := DecodeYAML(jsonKeys(40_000, false))
	if err != nil || len(v.(map[string]any)) != 40_000 {
		t.Fatalf("40,000 distinct keys: %v", err)
	}
}

// TestDecodeYAMLRefusals: what DecodeYAML refuses beyond yaml.v3: keys
// that are not strings, aliases within themselves, merge keys of other
// than mappings, too many alias values.
func TestDecodeYAMLRefusals(t *testing.T) {
	for _, c := range []struct{ name, doc, err string }{
		{"number key", "scheduling:\n  1: {worker_num: 1}\n",
			`scheduling: key 1 on line 2 is a number, not a string; keys must be strings (quote it, "1", to use it as one)`},
		{"null key", "~: 1\n", `spec: key ~ on line 1 is null, not a string; keys must be strings (quote it, "~", to use it as one)`},
		{"empty key", "? \n: 1\n", `spec: key (empty) on line 1 is null, not a string; keys must be strings (quote it, "", to use it as one)`},
		{"bool key", "placement: {true: 1}\n", `placement: key true on line 1 is a boolean, not a string; keys must be strings (quote it, "true", to use it as one)`},
		{"timestamp key", "2001-01-01: x\n", `spec: key 2001-01-01 on line 1 is a timestamp, not a string; keys must be strings (quote it, "2001-01-01", to use it as one)`},
		{"binary key", "!!binary aGk=: 1\n", `spec: key aGk= on line 1 is a value tagged !!binary, not a string; keys must be strings (quote it, "aGk=", to use it as one)`},
		{"list key", "scheduling:\n  env:\n    - ? [a, b]\n      : 1\n", `scheduling.env[0]: key on line 3 is a list; keys must be strings`},
		{"mapping key", "{a: 1}: b\n", `spec: key on line 1 is a mapping; keys must be strings`},
		{"alias of a number as key", "n: &n 1\nm: {*n : 2}\n", `m: key *n on line 2 names a number, not a string; keys must be strings`},
		{"alias within itself", "scheduling:\n  env: &e [*e]\n",
			`scheduling.env[0]: alias *e on line 2 lies within the value it names; an alias may only repeat a value that does not contain it`},
		{"alias within itself, deeper", "a: &a {b: [{c: *a}]}\n",
			`a.b[0].c: alias *a on line 1 lies within the value it names; an alias may only repeat a value that does not contain it`},
		{"merge of itself", "a: &a {<<: *a}\n",
			`a: alias *a on line 1 lies within the value it names; an alias may only repeat a value that does not contain it`},
		{"merge of a number", "a: {<<: 1}\n", `a: the merge key << takes a mapping, an alias of one, or a list of them; got a number on line 1`},
		{"merge of a list of numbers", "a: {<<: [{b: 1}, 2]}\n", `a: the merge key << takes a mapping, an alias of one, or a list of them; got a number on line 1`},
		{"merge of an alias of a list", "l: &l [1]\na: {<<: *l}\n", `a: the merge key << takes a mapping, an alias of one, or a list of them; got an alias of a list on line 2`},
		{"billion laughs", billionLaughs(),
			`f[0][2][0][6][0][3]: aliases expand to more than 100000 values; at most 100000 are allowed: write the values out, or use fewer aliases`},
		{"billion laughs of merges", mergeLaughs(),
			`c[3]: aliases expand to more than 100000 values; at most 100000 are allowed: write the values out, or use fewer aliases`},
		{"nesting through aliases", aliasDepth(),
			`deep[0][0][0][0][0][0][0][0][0][0][0]…(49984 levels)…[0][0][0][0]: nested more than 50000 deep (line 11); at most 50000 levels are allowed`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeYAML([]byte(c.doc))
			var fe *FieldError
			if err == nil || !errors.As(err, &fe) || err.Error() != c.err {
				t.Fatalf("got %v (%T), want FieldError %q", err, err, c.err)
			}
			if _, err := ParseSpec([]byte(c.doc)); !errors.As(err, &fe) {
				t.Fatalf("ParseSpec: got %v (%T), want a FieldError", err, err)
			}
		})
	}
}

// billionLaughs is the classic: nine levels of nine aliases of the one
// before, a few hundred bytes asking for 9^9 strings.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for c := 'b'; c <= 'i'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&b, "%c: &%c [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n", c, c, p, p, p, p, p, p, p, p, p)
	}
	return b.String()
}

// mergeLaughs merges one mapping of 1,000 keys into another, again and
// again: keys already there are skipped, but every skip is work.
func mergeLaughs() string {
	var b strings.Builder
	b.WriteString("a: &a {")
	for i := range 1000 {
		fmt.Fprintf(&b, "k%d: %d, ", i, i)
	}
	b.WriteString("}\nb: &b {<<: [" + strings.Repeat("*a, ", 20) + "]}\n")
	b.WriteString("c: [" + strings.Repeat("*b, ", 100) + "]\n")
	return b.String()
}

// aliasDepth nests aliases of deeply nested lists within each other, each
// defined where it is never read (a merged key the mapping already has),
// so that only their last use expands them: seven times 9,000 levels.
func aliasDepth() string {
	var b strings.Builder
	b.WriteString("x:\n  d0: 0\n  d1: 0\n  d2: 0\n  d3: 0\n  d4: 0\n  d5: 0\n  d6: 0\n  <<:\n")
	for i := range 7 {
		fmt.Fprintf(&b, "    d%d: &d%d %s", i, i, strings.Repeat("[", 9000))
		if i > 0 {
			fmt.Fprintf(&b, "*d%d", i-1)
		}
		b.WriteString(strings.Repeat("]", 9000) + "\n")
	}
	b.WriteString("deep: [*d6]\n")
	return b.String()
}

// TestDecodeYAMLDepth: nesting far past the parser's limit of 10,000 is
// refused as a syntax error, quickly, whatever the brackets.
func TestDecodeYAMLDepth(t *testing.T) {
	for _, c := range []struct{ name, doc string }{
		{"flow lists", strings.Repeat("[", 100_000)},
		{"json objects", strings.Repeat(`{"a":`, 100_000)},
		{"block lists", strings.Repeat("- ", 100_000)},
		{"mixed", strings.Repeat(`[{"a": `, 50_000)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.doc))
			want := "spec is not valid YAML or JSON: yaml: exceeded max depth of 10000"
			if err == nil || err.Error() != want {
				t.Fatalf("got %v, want %q", err, want)
			}
		})
	}
	// 9,999 levels are read as yaml.v3 reads them.
	doc := []byte("a: " + strings.Repeat("[", 9_999) + strings.Repeat("]", 9_999))
	sameAsUnmarshal(t, doc)
}

// TestParseSpecAliases: a spec may repeat a group with an alias and
// override a few of its keys with a merge.
func TestParseSpecAliases(t *testing.T) {
	s, err := ParseSpec([]byte(`
scheduling:
  train: &g {worker_num: 2, num_cpus: 2, num_gpus: 1}
  eval:
    <<: *g
    worker_num: 1
  env: [*g, {<<: [{num_gpus: 0.5}, *g], worker_num: 4}]
placement: {mode: auto}
`))
	if err != nil {
		t.Fatal(err)
	}
	g := func(n int, gpus float64) WorkerGroup { return WorkerGroup{WorkerNum: n, NumCPUs: 2, NumGPUs: gpus} }
	if want := g(2, 1); *s.Scheduling.Train != want {
		t.Errorf("train = %+v, want %+v", *s.Scheduling.Train, want)
	}
	if want := g(1, 1); *s.Scheduling.Eval != want {
		t.Errorf("eval = %+v, want %+v", *s.Scheduling.Eval, want)
	}
	if want := []WorkerGroup{g(2, 1), g(4, 0.5)}; !reflect.DeepEqual(s.Scheduling.Env, want) {
		t.Errorf("env = %+v, want %+v", s.Scheduling.Env, want)
	}
}

// TestDecodeYAMLSameAsUnmarshal: what DecodeYAML reads is what
// yaml.Unmarshal reads into an any.
func TestDecodeYAMLSameAsUnmarshal(t *testing.T) {
	docs := []string{
		"", "# only a comment\n", "---\n", "~", "null", "1", "[]", "{}", "a", `"a"`,
		"a: 1\nb: -2\nc: 0x1F\nd: 0o17\ne: 017\nf: 1_000\ng: 9223372036854775807\nh: 18446744073709551615\ni: 99999999999999999999\n",
		"a: 1.5\nb: -.5e3\nc: .inf\nd: -.Inf\ne: .nan\nf: 1e400\ng: !!float 1\n",
		"a: true\nb: False\nc: yes\nd: on\ne: ~\nf: null\ng:\nh: NULL\ni: 'true'\n",
		"a: 2001-12-14\nb: 2001-12-14t21:59:43.10-05:00\nc: 2001-12-14 21:59:43.10\nd: !!timestamp 2002-01-01\ne: !!str 2001-12-14\n",
		"a: !!binary aGVsbG8=\nb: !custom x\nc: !!str 12\nd: !!int \"12\"\ne: !!seq x\nf: !foo {a: 1}\ng: ! 12\n",
		"a: |\n  one\n  two\nb: >\n  folded\n  text\nc: 'it''s'\nd: \"\\u00e9\\n\"\n",
		"a: 1\n---\nb: 2\n", "--- [1, 2]\n...\n--- x\n",
		"a: &x {b: [1, 2]}\nc: *x\nd: [*x, *x]\n",
		"a: &s str\n*s : 1\n",
		"base: &base {a: 1, b: 2}\nx: {<<: *base, b: 3}\ny: {b: 3, <<: *base}\nz: {<<: [{a: 9}, *base], c: 1}\n",
		"a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: *b, z: 3}\nd: {<<: [*b, {x: 5, w: 6}]}\n",
		"a: {<<: {\"<<\": 1, b: 2}}\n",
		"a: {<<: {}}\nb: {!!merge <<: {c: 1}}\nc: {<<: []}\n",
		`{"scheduling": {"env": [{"worker_num": 2, "num_gpus": 0.5}]}, "placement": {"mode": "manual"}}`,
		"[{a: 1}, [2, [3]], ~, '']\n",
	}
	for _, d := range docs {
		sameAsUnmarshal(t, []byte(d))
	}
	files, _ := filepath.Glob("testdata/conformance/*.json")
	if len(files) == 0 {
		t.Fatal("no conformance cases")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sameAsUnmarshal(t, b)
	}
}

func sameAsUnmarshal(t *testing.T, doc []byte) {
	t.Helper()
	var want any
	if err := yaml.Unmarshal(doc, &want); err != nil {
		t.Fatalf("%.60q: yaml.Unmarshal: %v", doc, err)
	}
	got, err := DecodeYAML(doc)
	if err != nil {
		t.Fatalf("%.60q: %v", doc, err)
	}
	if !sameValue(got, want) {
		t.Fatalf("%.60q:\n got %#v\nwant %#v", doc, got, want)
	}
}

// sameValue is reflect.DeepEqual, but for NaN, which equals NaN here.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	}
	return reflect.DeepEqual(a, b)
}

// FuzzDecodeYAML: ParseSpec never panics; where yaml.Unmarshal reads a
// document, DecodeYAML reads the same or refuses it with a FieldError
// (a key given twice or not a string, an alias too many); where
// yaml.Unmarshal refuses one, so does DecodeYAML, but for keys it finds
// twice by the anchor's name rather than the key's, and for aliasing it
// finds excessive.
func FuzzDecodeYAML(f *testing.F) {
	for _, s := range []string{
		"scheduling:\n  train: {worker_num: 4, num_cpus: 1, num_gpus: 1}\nplacement: {mode: auto}\n",
		`{"scheduling": {"env": [{"worker_num": 2, "num_gpus": 0.5}]}, "placement": {"mode": "manual"}, "resource_pool": [{"name": "p", "num_node": 1, "num_gpus": 8, "env": "0-1"}]}`,
		"a: 1\na: 2\n", `{"a": 1, "a": 1}`, "a: {b: 1, \"b\": 2}\n", "- {a: 1, a: 2}\n",
		"a: &x {b: 1}\nc: *x\nd: {<<: *x, e: 2}\n", "a: &a [*a]\n", "a: &a {<<: *a}\n",
		"a: {<<: [{b: 1}, {b: 2, c: 3}], c: 4}\n", "1: a\n", "~: 1\n", "? [a]\n: 1\n",
		"a: .nan\nb: 2001-12-14\nc: !!binary aGk=\nd: !!int 0x10\n", "a: &k x\n*k : 1\n",
		billionLaughs(),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseSpec(data)
		got, err := DecodeYAML(data)
		var want any
		yerr := yaml.Unmarshal(data, &want)
		var fe *FieldError
		switch {
		case yerr == nil && err == nil:
			if !sameValue(got, want) {
				t.Fatalf("got %#v\nwant %#v", got, want)
			}
		case yerr == nil:
			if !errors.As(err, &fe) {
				t.Fatalf("yaml.Unmarshal reads it, DecodeYAML: %v (%T)", err, err)
			}
		case err == nil:
			msg := yerr.Error()
			if !strings.Contains(msg, "excessive aliasing") && !(strings.Contains(msg, "already defined") && !docHasDuplicates(data)) {
				t.Fatalf("yaml.Unmarshal: %v; DecodeYAML reads %#v", yerr, got)
			}
		}
	})
}

// docHasDuplicates says, the slow way, whether a mapping of doc has two
// keys of one name (aliases resolved).
func docHasDuplicates(doc []byte) bool {
	var n yaml.Node
	if yaml.Unmarshal(doc, &n) != nil {
		return false
	}
	var walk func(n *yaml.Node) bool
	walk = func(n *yaml.Node) bool {
		if n.Kind == yaml.MappingNode {
			for i := 0; i < len(n.Content); i += 2 {
				for j := i + 2; j < len(n.Content); j += 2 {
					a, b := keyName(n.Content[i]), keyName(n.Content[j])
					if a != "" && a == b {
						return true
					}
				}
			}
		}
		for _, c := range n.Content {
			if walk(c) {
				return true
			}
		}
		return false
	}
	return walk(&n)
}

// jsonKeys is a JSON object of n keys: all "a", or all different.
func jsonKeys(n int, dup bool) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		if dup {
			b.WriteString(`"a":1`)
		} else {
			fmt.Fprintf(&b, `"k%d":%d`, i, i)
		}
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// BenchmarkParseSpecDuplicateKeys: the request of the issue, n copies of
// one key in a JSON object (40,000: 240 KB).
func BenchmarkParseSpecDuplicateKeys(b *testing.B) {
	for _, n := range []int{3_000, 40_000} {
		data := jsonKeys(n, true)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := ParseSpec(data); err == nil {
					b.Fatal("duplicate keys read")
				}
			}
		})
	}
}

// BenchmarkParseSpecDistinctKeys: n different keys, all read (and then
// refused as unknown).
func BenchmarkParseSpecDistinctKeys(b *testing.B) {
	for _, n := range []int{3_000, 40_000} {
		data := jsonKeys(n, false)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := ParseSpec(data); err == nil {
					b.Fatal("unknown keys read")
				}
			}
		})
	}
}

// TestDecodeYAMLAliasBytes: aliases of a long scalar count for its
// length: 30,000 aliases of a 128 KiB !!binary blob (a 220 KB request)
// are refused at once, not decoded into gigabytes.
func TestDecodeYAMLAliasBytes(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: &x !!binary ")
	b.WriteString(strings.Repeat("QUFB", 128<<10/4))
	b.WriteString("\nb: [")
	for i := range 30000 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("*x")
	}
	b.WriteString("]\n")
	_, err := DecodeYAML([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "aliases expand to more than") {
		t.Fatalf("%d bytes of aliased blob: %v", b.Len(), err)
	}
}
