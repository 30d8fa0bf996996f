package planner

import (
	"fmt"
	"slices"
	"strings"
)

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
			s, ok := scalarString(v)
			if !ok || k == "" || len(k) > 256 || len(s) > 256 {
				return nil, fieldErr(field+"."+k, "%s is not allowed; want a label name and a string value, each at most 256 bytes", show(v))
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
