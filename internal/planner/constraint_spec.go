package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// NameRule bounds a name that comes from outside and ends up in a NATS
// subject, a KV key or a label: its length in bytes and its alphabet,
// ASCII letters and digits and the punctuation Punct. With Dots, '.'
// is allowed too, as a separator of non-empty parts (not first, not
// last, never two in a row), so that a name placed in a subject never
// makes an empty token. Each kind of name has one rule, beside the code
// that owns the kind: bus.PlanNameRule, inventory.NodeIDRule,
// LabelKeyRule; every entry point checks its names with it.
type NameRule struct {
	// Kind names the kind in errors: "plan name", "node id".
	Kind  string
	Max   int
	Punct string
	Dots  bool
	// Err, when set, is wrapped by Check's errors (client.ErrBadRequest,
	// inventory.ErrInvalidNodeID), so that callers can tell them apart.
	Err error
}

// String states the rule, as errors end with it: "want 1 to 64 bytes of
// ASCII letters, digits and - _ =".
func (r NameRule) String() string {
	var punct []string
	for _, c := range r.Punct {
		punct = append(punct, string(c))
	}
	if r.Dots {
		punct = append(punct, ".")
	}
	s := fmt.Sprintf("want 1 to %d bytes of ASCII letters, digits and %s", r.Max, strings.Join(punct, " "))
	if r.Dots {
		s += " (a dot neither first, last nor next to another)"
	}
	return s
}

// Check returns nil when name follows r; else an error naming the kind,
// the name (cut short when long), what is wrong (its length, or the
// character and where), and the rule: `invalid plan name "a.b": '.' at
// byte 1 is not allowed; want 1 to 64 bytes of ...`.
func (r NameRule) Check(name string) error {
	if problem := r.problem(name); problem != "" {
		return &NameError{Rule: r, Name: name, Problem: problem}
	}
	return nil
}

func (r NameRule) problem(name string) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > r.Max:
		return fmt.Sprintf("%d bytes is too long", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c < utf8.RuneSelf && strings.IndexByte(r.Punct, c) >= 0:
		case c == '.' && r.Dots:
			if i == 0 || i == len(name)-1 || name[i+1] == '.' {
				return fmt.Sprintf("'.' at byte %d is not allowed", i)
			}
		default:
			ru, _ := utf8.DecodeRuneInString(name[i:])
			what := strconv.QuoteRune(ru)
			if ru == utf8.RuneError {
				what = fmt.Sprintf("byte %#02x", c)
			}
			return fmt.Sprintf("%s at byte %d is not allowed", what, i)
		}
	}
	return ""
}

// NameError is a name that breaks its NameRule.
type NameError struct {
	Rule    NameRule
	Name    string
	Problem string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("invalid %s %s: %s; %s", e.Rule.Kind, QuoteShort(e.Name), e.Problem, e.Rule)
}

// Unwrap is the rule's Err.
func (e *NameError) Unwrap() error { return e.Rule.Err }

// QuoteShort quotes s for an error message, its first 40 bytes only when
// it is longer than 64 ("..." and its length follow): a name of 4 KB
// must not make a 4 KB error.
func QuoteShort(s string) string {
	// Bounded as written: a byte that quotes as \u202e takes six.
	if q := strconv.Quote(s); len(q) <= 56 {
		return q
	}
	cut := 0
	for i := range s {
		if len(strconv.Quote(s[:i])) > 36 {
			break
		}
		cut = i
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// LabelKeyRule is a node label's key, in node inventories (labels,
// reporter --label) and in specs (node_selector): Kubernetes' label key
// alphabet (nvidia.com/gpu.clique, topology.kubernetes.io/zone) and
// its length bound for a prefix.
var LabelKeyRule = NameRule{Kind: "label key", Max: 253, Punct: "-_/", Dots: true}

// MaxLabelValue bounds a label's value in a node_selector.
const MaxLabelValue = 256

// parseConstraints reads a group's node_selector, gpu_model,
// min_gpu_memory_gb, gpu_link and nvlink_domain, and checks they suit a
// group of workers of gpus GPUs (buffer: the buffer group, which
// follows train and takes none).
func parseConstraints(field string, m map[string]any, gpus float64, buffer bool) (*Constraints, error) {
	c := &Constraints{}
	var err error
	if c.NodeSelector, err = parseSelector(field+".node_selector", m["node_selector"]); err != nil {
		return nil, err
	}
	if c.GPUModels, err = parseModels(field+".gpu_model", m["gpu_model"]); err != nil {
		return nil, err
	}
	if c.GPULink, err = parseChoice(field+".gpu_link", m["gpu_link"], LinkAny, LinkNVLink, LinkNUMA, LinkPreferNVLink); err != nil {
		return nil, err
	}
	if c.NVLinkDomain, err = parseChoice(field+".nvlink_domain", m["nvlink_domain"], DomainAny, DomainPack, DomainStrict); err != nil {
		return nil, err
	}
	if raw, ok := m["min_gpu_memory_gb"]; ok && raw != nil {
		n, ok := number(raw)
		if !ok || n <= 0 || n > 1<<20 {
			return nil, fieldErr(field+".min_gpu_memory_gb", "%s is not allowed; want a number of gigabytes > 0", show(raw))
		}
		c.MinGPUMemoryGB = n
	}
	switch {
	case c.any() && buffer:
		return nil, fieldErr(field, "node_selector, gpu_model, min_gpu_memory_gb, gpu_link and nvlink_domain are not allowed for buffer: buffers follow their train workers")
	case c.gpuWise() && gpus == 0:
		return nil, fieldErr(field, "gpu_model and min_gpu_memory_gb need num_gpus > 0")
	case c.NVLinkDomain != "" && gpus == 0:
		return nil, fieldErr(field+".nvlink_domain", "%s places GPU workers among NVLink domains: it needs num_gpus > 0", c.NVLinkDomain)
	case c.GPULink != "" && gpus < 2:
		return nil, fieldErr(field+".gpu_link", "%s links the GPUs of one worker: it needs num_gpus of 2 or more", c.GPULink)
	}
	return c, nil
}

// parseSelector reads node_selector: label: value.
func parseSelector(field string, v any) (map[string]string, error) {
	switch sel := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		if len(sel) > 64 {
			return nil, fieldErr(field, "%d labels; at most 64", len(sel))
		}
		out := map[string]string{}
		for k, v := range sel {
			if err := LabelKeyRule.Check(k); err != nil {
				return nil, fieldErr(field, "%v", err)
			}
			s, ok := scalarString(v)
			if !ok || len(s) > MaxLabelValue {
				return nil, fieldErr(field+"."+k, "%s is not allowed; want a string value of at most %d bytes", QuoteShort(show(v)), MaxLabelValue)
			}
			out[k] = s
		}
		return out, nil
	default:
		return nil, fieldErr(field, "want a mapping of label: value, got %s", kindOf(sel))
	}
}

// parseModels reads gpu_model: a model name or a list of them.
func parseModels(field string, v any) ([]string, error) {
	var out []string
	switch gm := v.(type) {
	case nil:
		return nil, nil
	case string:
		out = []string{gm}
	case []any:
		if len(gm) == 0 {
			return nil, fieldErr(field, "an empty list matches nothing; want a model name or a list of them")
		}
		for i, v := range gm {
			s, ok := v.(string)
			if !ok {
				return nil, fieldErr(fmt.Sprintf("%s[%d]", field, i), "%s is not allowed; want a model name such as H100", show(v))
			}
			out = append(out, s)
		}
	default:
		return nil, fieldErr(field, "want a model name such as H100, or a list of them, got %s", kindOf(gm))
	}
	for i, s := range out {
		if strings.TrimSpace(s) == "" || len(s) > 128 {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", field, i), "%q is not allowed; want a model name such as H100", s)
		}
	}
	return out, nil
}

// parseChoice reads one of allowed, the first being the default, which
// reads as "".
func parseChoice(field string, v any, allowed ...string) (string, error) {
	want := strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		if !slices.Contains(allowed, x) {
			return "", fieldErr(field, "%q is not allowed; want %s", x, want)
		}
		if x == allowed[0] {
			return "", nil
		}
		return x, nil
	default:
		return "", fieldErr(field, "want %s, got %s", want, kindOf(x))
	}
}

// scalarString is v as a label value: a string, or a number or boolean
// YAML read as one.
func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(x), true
	}
	return "", false
}
