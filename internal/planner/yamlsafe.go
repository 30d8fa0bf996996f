package planner

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// MaxAliasValues bounds the values that YAML aliases (*name) and merge
// keys (<<: *name) may copy into one document: each alias is expanded
// afresh, so a few lines of nested aliases ("billion laughs") could
// otherwise ask for billions.
const MaxAliasValues = 100_000

// MaxNesting bounds how deep collections nest in a decoded document,
// aliases expanded. (The YAML parser already refuses flow collections
// or indentation more than 10,000 levels deep; this bounds what aliases
// add.)
const MaxNesting = 50_000

// DecodeYAML reads the first document of data, YAML or JSON (JSON is read
// as YAML), into the values yaml.Unmarshal gives for an `any`:
// map[string]any, []any, string, int, int64, uint64, float64, bool,
// time.Time and nil, with scalars resolved by yaml.v3 itself. Unlike
// yaml.Unmarshal, which compares every pair of keys of a mapping and
// writes an error for each pair that matches, it takes time and memory
// linear in the document (the aliases it expands included):
//
//   - a key given twice in one mapping is refused at the second, with
//     both lines;
//   - a key that is not a string (1:, null:, [a]:) is refused;
//   - aliases and merge keys (<<) are expanded as yaml.v3 does, up to
//     MaxAliasValues values; an alias within the value it names is
//     refused;
//   - collections nest at most MaxNesting deep.
//
// Syntax errors come back as yaml.v3 gives them (as do scalars whose tag
// does not fit their value, such as !!int abc); refusals come back as a
// *FieldError naming the field ("spec" for the top level) and saying
// what is allowed.
func DecodeYAML(data []byte) (any, error) {
	var doc yaml.Node
	// Parsing to a Node is linear: yaml.v3 neither resolves nor checks
	// keys on the way.
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	c := yamlConv{}
	var v any
	var err error
	switch {
	case doc.Kind == 0:
		// No document at all (empty input, or only comments).
		return nil, nil
	case doc.Kind == yaml.DocumentNode:
		if len(doc.Content) != 1 {
			return nil, nil
		}
		v, err = c.value(doc.Content[0], 0)
	default:
		v, err = c.value(&doc, 0)
	}
	if ce, ok := err.(*convErr); ok {
		return nil, ce.fieldError()
	}
	return v, err
}

// yamlConv converts a yaml.Node tree to plain values.
type yamlConv struct {
	// inAlias is how many aliases are being expanded around the node at
	// hand; aliasValues counts the nodes visited in them.
	inAlias     int
	aliasValues int
	// open holds the anchored collections being converted: an alias of
	// one of them would expand forever.
	open map[*yaml.Node]bool
}

// convErr is a refusal on its way up the tree, gathering its path.
type convErr struct {
	path []pathSeg // innermost first
	msg  string
}

type pathSeg struct {
	key   string
	index int // -1 for a key
}

func (e *convErr) Error() string { return e.fieldError().Error() }

func (e *convErr) fieldError() *FieldError {
	var b strings.Builder
	elided := false
	for i := len(e.path) - 1; i >= 0; i-- {
		// A path thousands of levels deep names its first and last steps.
		const head, tail = 12, 4
		if n := len(e.path); n > head+tail+1 && i == n-1-head {
			fmt.Fprintf(&b, "…(%d levels)…", n-head-tail)
			i = tail - 1
			elided = true
		}
		s := e.path[i]
		switch {
		case s.index >= 0:
			fmt.Fprintf(&b, "[%d]", s.index)
		case b.Len() > 0 && !elided:
			b.WriteString("." + clip(s.key))
		default:
			b.WriteString(clip(s.key))
		}
		elided = false
	}
	field := b.String()
	if field == "" || field[0] == '[' {
		field = "spec" + field
	}
	return &FieldError{Field: field, Msg: e.msg}
}

// clip shortens a name a person gave, which may be long, for a message.
func clip(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func refuse(format string, args ...any) error {
	return &convErr{msg: fmt.Sprintf(format, args...)}
}

// under adds a step to the path of err, a refusal below that step.
func under(err error, key string, index int) error {
	if ce, ok := err.(*convErr); ok {
		ce.path = append(ce.path, pathSeg{key: key, index: index})
	}
	return err
}

// visit counts a node visited within an alias: one, and one more for
// every 64 bytes of its text, so that an alias of a long scalar (a
// !!binary blob, say) counts for what decoding it again costs.
func (c *yamlConv) visit(n *yaml.Node) error {
	if c.inAlias == 0 {
		return nil
	}
	c.aliasValues += 1 + len(n.Value)/64
	if c.aliasValues > MaxAliasValues {
		return refuse("aliases expand to more than %d values; at most %d are allowed: write the values out, or use fewer aliases", MaxAliasValues, MaxAliasValues)
	}
	return nil
}

func (c *yamlConv) value(n *yaml.Node, depth int) (any, error) {
	if err := c.visit(n); err != nil {
		return nil, err
	}
	switch n.Kind {
	case yaml.ScalarNode:
		return scalarValue(n)
	case yaml.AliasNode:
		return c.alias(n, depth)
	case yaml.SequenceNode, yaml.MappingNode:
	default:
		return nil, refuse("line %d: a YAML node of kind %d is not allowed here", n.Line, n.Kind)
	}
	if depth >= MaxNesting {
		return nil, refuse("nested more than %d deep (line %d); at most %d levels are allowed", MaxNesting, n.Line, MaxNesting)
	}
	if n.Anchor != "" {
		c.enter(n)
		defer delete(c.open, n)
	}
	if n.Kind == yaml.MappingNode {
		return c.mapping(n, depth)
	}
	s := make([]any, len(n.Content))
	for i, item := range n.Content {
		v, err := c.value(item, depth+1)
		if err != nil {
			return nil, under(err, "", i)
		}
		s[i] = v
	}
	return s, nil
}

func (c *yamlConv) enter(n *yaml.Node) {
	if c.open == nil {
		c.open = map[*yaml.Node]bool{}
	}
	c.open[n] = true
}

// target is what alias n names, refused when it is being converted.
func (c *yamlConv) target(n *yaml.Node) (*yaml.Node, error) {
	if n.Alias == nil {
		return nil, refuse("line %d: alias *%s names no anchor", n.Line, clip(n.Value))
	}
	if c.open[n.Alias] {
		return nil, refuse("alias *%s on line %d lies within the value it names; an alias may only repeat a value that does not contain it", clip(n.Value), n.Line)
	}
	return n.Alias, nil
}

func (c *yamlConv) alias(n *yaml.Node, depth int) (any, error) {
	t, err := c.target(n)
	if err != nil {
		return nil, err
	}
	c.inAlias++
	defer func() { c.inAlias-- }()
	return c.value(t, depth)
}

// scalarValue resolves a scalar as yaml.Unmarshal into an `any` does.
func scalarValue(n *yaml.Node) (any, error) {
	if n.Tag == "!!str" {
		// What the parser tags every plain string and every quoted
		// scalar with; yaml.v3 takes its value as it is.
		return n.Value, nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// mapKey reads a mapping key: a string (also through an alias) or the
// merge key <<.
func (c *yamlConv) mapKey(k *yaml.Node) (name string, merge bool, err error) {
	if err := c.visit(k); err != nil {
		return "", false, err
	}
	switch {
	case isMergeKey(k):
		return "<<", true, nil
	case k.Kind == yaml.ScalarNode && isStringScalar(k):
		return k.Value, false, nil
	case k.Kind == yaml.AliasNode && k.Alias != nil && k.Alias.Kind == yaml.ScalarNode && isStringScalar(k.Alias):
		return k.Alias.Value, false, nil
	}
	switch n := k; {
	case n.Kind == yaml.AliasNode && n.Alias != nil:
		return "", false, refuse("key *%s on line %d names %s, not a string; keys must be strings", clip(n.Value), n.Line, nodeKind(n.Alias))
	case n.Kind == yaml.ScalarNode:
		return "", false, refuse("key %s on line %d is %s, not a string; keys must be strings (quote it, %q, to use it as one)", showScalar(n), n.Line, nodeKind(n), clip(n.Value))
	default:
		return "", false, refuse("key on line %d is %s; keys must be strings", n.Line, nodeKind(n))
	}
}

// isStringScalar says whether yaml.v3 reads scalar n as a string key of a
// map[string]any, as it is.
func isStringScalar(n *yaml.Node) bool {
	switch n.Tag {
	case "!!str", "tag:yaml.org,2002:str":
		return true
	case "", "!":
		return n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0
	}
	return false
}

// isMergeKey is yaml.v3's test for a merge key.
func isMergeKey(n *yaml.Node) bool {
	if n.Kind != yaml.ScalarNode || n.Value != "<<" {
		return false
	}
	switch n.Tag {
	case "", "!", "!!merge", "tag:yaml.org,2002:merge":
		return true
	}
	return false
}

func showScalar(n *yaml.Node) string {
	if n.Value == "" {
		return "(empty)"
	}
	return clip(n.Value)
}

// nodeKind names what node n holds, for a person.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "a boolean"
		case "!!null":
			return "null"
		case "!!timestamp":
			return "a timestamp"
		case "!!merge":
			return "a merge key"
		case "!!str":
			return "a string"
		}
		return "a value tagged " + clip(n.ShortTag())
	}
	return fmt.Sprintf("a YAML node of kind %d", n.Kind)
}

// mapping converts mapping n; a key given twice is refused. Its merge
// key, if any, is applied after its own keys, which win, as yaml.v3 does.
func (c *yamlConv) mapping(n *yaml.Node, depth int) (any, error) {
	m := make(map[string]any, len(n.Content)/2)
	var merge *yaml.Node
	sawMergeName := false // "<<", as the merge key or a quoted key
	for i := 0; i+1 < len(n.Content); i += 2 {
		name, isMerge, err := c.mapKey(n.Content[i])
		if err != nil {
			return nil, err
		}
		dup := false
		if name == "<<" {
			dup = sawMergeName
			sawMergeName = true
		} else {
			_, dup = m[name]
		}
		if dup {
			return nil, c.twice(n, i, name)
		}
		if isMerge {
			merge = n.Content[i+1]
			continue
		}
		v, err := c.value(n.Content[i+1], depth+1)
		if err != nil {
			return nil, under(err, name, -1)
		}
		m[name] = v
	}
	if merge != nil {
		if err := c.mergeFrom(merge, m, depth); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// twice refuses key i of mapping n, given before.
func (c *yamlConv) twice(n *yaml.Node, i int, name string) error {
	second := n.Content[i]
	first := second
	for j := 0; j < i; j += 2 {
		k := n.Content[j]
		if keyName(k) == name {
			first = k
			break
		}
	}
	where := fmt.Sprintf("lines %d and %d", first.Line, second.Line)
	if first.Line == second.Line {
		where = fmt.Sprintf("line %d, columns %d and %d", first.Line, first.Column, second.Column)
	}
	return refuse("key %q appears twice (%s); give each key once", clip(name), where)
}

// keyName is the name mapKey reads for key k, or "" for none.
func keyName(k *yaml.Node) string {
	switch {
	case isMergeKey(k):
		return "<<"
	case k.Kind == yaml.ScalarNode && isStringScalar(k):
		return k.Value
	case k.Kind == yaml.AliasNode && k.Alias != nil && k.Alias.Kind == yaml.ScalarNode && isStringScalar(k.Alias):
		return k.Alias.Value
	}
	return ""
}

// mergeFrom applies the value of a merge key to m: a mapping, an alias of
// one, or a list of these, the first to give a key winning; keys m
// already has stay.
func (c *yamlConv) mergeFrom(src *yaml.Node, m map[string]any, depth int) error {
	switch src.Kind {
	case yaml.MappingNode, yaml.AliasNode:
		return c.mergeOne(src, m, depth)
	case yaml.SequenceNode:
		for _, item := range src.Content {
			if err := c.visit(item); err != nil {
				return err
			}
			if err := c.mergeOne(item, m, depth); err != nil {
				return err
			}
		}
		return nil
	}
	return badMerge(src)
}

func badMerge(n *yaml.Node) error {
	got := nodeKind(n)
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		got = "an alias of " + nodeKind(n.Alias)
	}
	return refuse("the merge key << takes a mapping, an alias of one, or a list of them; got %s on line %d", got, n.Line)
}

// mergeOne merges a mapping, or an alias of one, into m.
func (c *yamlConv) mergeOne(src *yaml.Node, m map[string]any, depth int) error {
	if src.Kind == yaml.AliasNode {
		t, err := c.target(src)
		if err != nil {
			return err
		}
		if t.Kind != yaml.MappingNode {
			return badMerge(src)
		}
		c.inAlias++
		defer func() { c.inAlias-- }()
		if err := c.visit(t); err != nil {
			return err
		}
		src = t
	} else if src.Kind != yaml.MappingNode {
		return badMerge(src)
	}
	if depth+1 >= MaxNesting {
		return refuse("nested more than %d deep (line %d); at most %d levels are allowed", MaxNesting, src.Line, MaxNesting)
	}
	if src.Anchor != "" {
		c.enter(src)
		defer delete(c.open, src)
	}
	seen := make(map[string]bool, len(src.Content)/2)
	var nested *yaml.Node
	for i := 0; i+1 < len(src.Content); i += 2 {
		name, isMerge, err := c.mapKey(src.Content[i])
		if err != nil {
			return err
		}
		if seen[name] {
			return c.twice(src, i, name)
		}
		seen[name] = true
		if isMerge {
			nested = src.Content[i+1]
			continue
		}
		if _, ok := m[name]; ok || name == "<<" {
			continue
		}
		v, err := c.value(src.Content[i+1], depth+1)
		if err != nil {
			return under(err, name, -1)
		}
		m[name] = v
	}
	if nested != nil {
		return c.mergeFrom(nested, m, depth)
	}
	return nil
}
