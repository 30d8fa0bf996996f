package planner

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/poolplanner/poolplanner/plan"
)

// SpecFormat says what kind of document a spec file is.
type SpecFormat int

const (
	// FormatNative is poolplanner's own spec: scheduling, placement,
	// resource_pool, priority, max_gpus.
	FormatNative SpecFormat = iota
	// FormatRLightningJob is a composed rlightning job config: the
	// cluster, env, buffer and policy groups (and the rest: engine, train,
	// log, ...), as `python train.py --cfg job --resolve` prints it.
	FormatRLightningJob
	// FormatRLightningCluster is one rlightning `cluster` group file:
	// train_worker_num, eval_worker_num, placement, resource_pool, ...
	// at the top level.
	FormatRLightningCluster
)

func (f SpecFormat) String() string {
	switch f {
	case FormatRLightningJob:
		return "rlightning job config"
	case FormatRLightningCluster:
		return "rlightning cluster config"
	}
	return "poolplanner spec"
}

// Default is a value a translation took from rlightning's defaults, for
// a group the config does not give, or a placement poolplanner has no
// equal of.
type Default struct {
	// Field is rlightning's name of it: "env", "buffer.storage",
	// "policy", "cluster.placement.strategy".
	Field string
	// Value is what was assumed, in YAML flow style.
	Value string
	// Why, when set, says why rlightning's value could not be kept.
	Why string
}

// SpecSource is a spec file as read: its spec, the poolplanner spec text
// it stands for and, for a rlightning config, what the translation
// ignored and assumed.
type SpecSource struct {
	Format SpecFormat
	Spec   *Spec
	// Native is the poolplanner spec text Spec is read from: the file
	// itself for a native spec, the translation of a rlightning config.
	// It is what is stored and sent, so the service only ever reads
	// native specs.
	Native []byte
	// Ignored are the rlightning fields (dotted paths, env[i] for an env
	// group) that do not change the scheduling, in the order met.
	Ignored []string
	// Assumed are the defaults taken for what the config lacks.
	Assumed []Default
}

// The keys that tell a rlightning config from a native spec. A document
// with a `scheduling` key is native, whatever else it holds; otherwise a
// document with any rlightning MainConfig group is a job config, and one
// with any ClusterConfig field a native spec has no equal of is a
// cluster group. placement and resource_pool, which both formats have,
// decide nothing: a document of only those stays native, and keeps the
// error it always had.
var (
	rlJobKeys     = []string{"cluster", "env", "buffer", "policy", "train", "engine", "log"}
	rlClusterKeys = []string{"train_worker_num", "eval_worker_num", "buffer_worker_num",
		"train_each_gpu_num", "eval_each_gpu_num", "ray_address", "remote_train", "remote_eval",
		"remote_storage", "remote_env", "is_colocated", "enable_offload", "rollout_env_interaction"}
)

// DetectFormat says which format a decoded spec document is in (see the
// rule at rlJobKeys).
func DetectFormat(raw any) SpecFormat {
	top, ok := raw.(map[string]any)
	if !ok {
		return FormatNative
	}
	if _, ok := top["scheduling"]; ok {
		return FormatNative
	}
	for _, k := range rlJobKeys {
		if _, ok := top[k]; ok {
			return FormatRLightningJob
		}
	}
	for _, k := range rlClusterKeys {
		if _, ok := top[k]; ok {
			return FormatRLightningCluster
		}
	}
	return FormatNative
}

// ReadSpec reads a spec file in either format: a poolplanner spec, read
// by ParseSpec exactly as before, or a rlightning job or cluster config,
// turned into the scheduling rlightning's setup_component_scheduling
// builds from it (see ConvertRLightning).
func ReadSpec(data []byte) (*SpecSource, error) {
	raw, err := DecodeYAML(data)
	if err != nil || DetectFormat(raw) == FormatNative {
		if top, ok := raw.(map[string]any); ok && err == nil {
			if _, hydra := top["defaults"]; hydra {
				if _, native := top["scheduling"]; !native {
					return nil, hydraDefaults(top["defaults"])
				}
			}
		}
		s, err := ParseSpec(data)
		if err != nil {
			return nil, err
		}
		return &SpecSource{Format: FormatNative, Spec: s, Native: data}, nil
	}
	return ConvertRLightning(raw)
}

func hydraDefaults(v any) error {
	return fieldErr("defaults", "a Hydra defaults list (%s) is not composed; poolplanner reads composed configs: print the job's with `python train.py GROUP=OPTION... --cfg job --resolve`, or write each group's contents in place of the list", oneLine(flowYAML(v)))
}

// ConvertRLightning turns a decoded rlightning job or cluster config into
// the poolplanner spec of the scheduling rlightning builds from it
// (rlightning/utils/placement/scheduling.py, setup_component_scheduling):
//
//   - env: one group per entry of env (a mapping is one entry), each
//     num_workers workers of num_cpus CPUs and num_gpus GPUs
//     (EnvConfig's defaults 1, 1 and 0);
//   - train and eval: cluster.train_worker_num and eval_worker_num
//     workers (default 1), 1 CPU each, policy.train_num_gpus and
//     eval_num_gpus GPUs (default 1.0);
//   - buffer: cluster.buffer_worker_num (default 1, or auto) workers of
//     1 CPU, forced to 1 for unified storage and to storage.num_shards for
//     sharded storage that gives it; 1 GPU only for cuda storage;
//   - cluster.placement and cluster.resource_pool as they are, but
//     strategy "default" (Ray places the workers, no pools) is planned as
//     disaggregate, and said so.
//
// Every other field is accepted and ignored, unresolved ${...}
// interpolations in it too; the fields above must be resolved. A key
// near one of them (train_worker_nums, num_worker, num_train_workers)
// that is no field of rlightning's class is refused as a typo.
func ConvertRLightning(raw any) (*SpecSource, error) {
	format := DetectFormat(raw)
	top, ok := raw.(map[string]any)
	if !ok || format == FormatNative {
		return nil, fieldErr("spec", "not a rlightning job or cluster config; want a mapping with cluster, env, buffer and policy, or a cluster group's train_worker_num, eval_worker_num, placement, ...")
	}
	if d, ok := top["defaults"]; ok {
		return nil, hydraDefaults(d)
	}
	c := &rlConv{}
	var r rlScheduling
	if err := c.read(format, top, &r); err != nil {
		return nil, err
	}
	native := r.nativeYAML()
	s, err := ParseSpec(native)
	if err != nil {
		return nil, c.nativeErr(err)
	}
	return &SpecSource{Format: format, Spec: s, Native: native, Ignored: c.ignored, Assumed: c.assumed}, nil
}

// rlScheduling is rlightning's ComponentScheduling, with the placement
// and pools beside it.
type rlScheduling struct {
	train, eval, buffer rlGroup
	env                 []rlGroup
	placement           Placement
	// pools says whether rlightning makes pools (a strategy other than
	// its "default", or manual mode); poolList is cluster.resource_pool.
	pools    bool
	poolList []any
}

type rlGroup struct {
	workers    int
	auto       bool
	cpus, gpus float64
}

// rlConv gathers what a translation ignores and assumes.
type rlConv struct {
	// cluster is where the cluster fields are: "cluster." in a job
	// config, "" in a cluster group.
	cluster string
	ignored []string
	assumed []Default
}

// The fields of rlightning's config classes (rlightning/utils/config/
// config.py): a key of these is never taken for a typo of another.
var (
	rlMainFields    = []string{"engine", "env", "buffer", "policy", "train", "cluster", "log", "debug", "verbose"}
	rlClusterFields = append([]string{"placement", "resource_pool"}, rlClusterKeys...)
	rlEnvFields     = []string{"name", "backend", "task", "num_workers", "num_envs", "max_episode_steps",
		"num_cpus", "num_gpus", "env_kwargs", "init_params", "policy_setup", "evaluate_cfg"}
	rlBufferFields = []string{"type", "capacity", "sampler", "auto_truncate_episode", "storage",
		"node_affinity_env", "node_affinity_train"}
	rlStorageFields = []string{"mode", "type", "unit", "device", "num_shards"}
	rlPolicyFields  = []string{"type", "backend", "train_num_gpus", "eval_num_gpus", "model_cfg",
		"optim_cfg", "rollout_mode", "router_type", "weight_buffer", "policy_kwargs"}
)

func (c *rlConv) read(format SpecFormat, top map[string]any, r *rlScheduling) error {
	groups := map[string]any{}
	if format == FormatRLightningCluster {
		groups["cluster"] = top
	} else {
		c.cluster = "cluster."
		used := []string{"cluster", "env", "buffer", "policy"}
		if err := c.sortOut("", top, used, rlMainFields); err != nil {
			return err
		}
		for _, k := range used {
			if v, ok := top[k]; ok {
				groups[k] = v
			}
		}
		if v, ok := groups["cluster"]; !ok || v == nil {
			return fieldErr("cluster", "missing; without a cluster group rlightning runs the job locally, with no placement to plan: add one (cluster=...)")
		}
	}
	pol, err := c.policy(groups["policy"])
	if err != nil {
		return err
	}
	if err := c.clusterGroup(groups["cluster"], pol, r); err != nil {
		return err
	}
	if r.env, err = c.envGroups(groups["env"]); err != nil {
		return err
	}
	if err := c.bufferGroup(groups["buffer"], r); err != nil {
		return err
	}
	return c.rewritten(groups, r)
}

// sortOut checks the keys of mapping m (at path prefix): a key in used
// is read by the caller, a key near one of them that is no field of
// the class (known) is refused as a typo, and every other key is
// ignored and listed.
func (c *rlConv) sortOut(prefix string, m map[string]any, used, known []string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if contains(used, k) {
			continue
		}
		if !contains(known, k) {
			for _, u := range used {
				if _, given := m[u]; !given && nearMiss(k, u) {
					return fieldErr(prefix+k, "unknown key (did you mean %s?); rlightning would ignore it and take %s's default", u, u)
				}
			}
		}
		c.ignored = append(c.ignored, prefix+k)
	}
	return nil
}

type rlPolicy struct{ train, eval float64 }

func (c *rlConv) policy(v any) (rlPolicy, error) {
	p := rlPolicy{train: 1, eval: 1}
	if v == nil {
		c.assumed = append(c.assumed, Default{Field: "policy", Value: "{train_num_gpus: 1.0, eval_num_gpus: 1.0}"})
		return p, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return p, fieldErr("policy", "want a mapping (rlightning's policy group), got %s", kindOf(v))
	}
	if err := c.sortOut("policy.", m, []string{"train_num_gpus", "eval_num_gpus"}, rlPolicyFields); err != nil {
		return p, err
	}
	var err error
	if p.train, err = rlGPUs("policy.train_num_gpus", m, 1); err != nil {
		return p, err
	}
	p.eval, err = rlGPUs("policy.eval_num_gpus", m, 1)
	return p, err
}

func (c *rlConv) clusterGroup(v any, pol rlPolicy, r *rlScheduling) error {
	name := strings.TrimSuffix(c.cluster, ".")
	m, ok := v.(map[string]any)
	if !ok {
		return fieldErr(name, "want a mapping (rlightning's cluster group), got %s", kindOf(v))
	}
	used := []string{"train_worker_num", "eval_worker_num", "buffer_worker_num", "placement", "resource_pool"}
	// rlightning would take a misspelt train_worker_num for an extra
	// field and plan the default, 1: sortOut refuses a key near one read.
	// Other unknown keys stay ignored, as rlightning ignores them (its own
	// wbc_tracking example spells remote_storge).
	prefix := c.cluster
	if err := c.sortOut(prefix, m, used, rlClusterFields); err != nil {
		return err
	}
	var err error
	r.train = rlGroup{cpus: 1, gpus: pol.train}
	if r.train.workers, _, err = rlWhole(prefix+"train_worker_num", m, 1, false); err != nil {
		return err
	}
	r.eval = rlGroup{cpus: 1, gpus: pol.eval}
	if r.eval.workers, _, err = rlWhole(prefix+"eval_worker_num", m, 1, false); err != nil {
		return err
	}
	r.buffer = rlGroup{cpus: 1}
	if r.buffer.workers, r.buffer.auto, err = rlWhole(prefix+"buffer_worker_num", m, 1, true); err != nil {
		return err
	}
	if r.pools, err = c.placement(prefix+"placement", m["placement"], &r.placement); err != nil {
		return err
	}
	return c.resourcePool(prefix+"resource_pool", m["resource_pool"], r)
}

// placement reads cluster.placement into out, and says whether
// rlightning makes pools for it (a strategy other than "default", or
// manual mode).
func (c *rlConv) placement(field string, v any, out *Placement) (pools bool, err error) {
	*out = Placement{Mode: ModeAuto, Strategy: "default", EnvStrategy: EnvStrategyDefault}
	if v != nil {
		m, ok := v.(map[string]any)
		if !ok {
			return false, fieldErr(field, "want a mapping with mode, strategy and env_strategy, got %s", kindOf(v))
		}
		keys := []string{"mode", "strategy", "env_strategy"}
		if err := c.sortOut(field+".", m, keys, keys); err != nil {
			return false, err
		}
		pick := func(key string, dst *string, allowed ...string) error {
			raw, ok := m[key]
			if !ok {
				return nil
			}
			if err := resolved(field+"."+key, raw); err != nil {
				return err
			}
			s, ok := raw.(string)
			if !ok || !contains(allowed, s) {
				return fieldErr(field+"."+key, "%s is not allowed; want one of %s", show(raw), strings.Join(allowed, ", "))
			}
			*dst = s
			return nil
		}
		if err := pick("mode", &out.Mode, ModeAuto, ModeManual); err != nil {
			return false, err
		}
		if err := pick("strategy", &out.Strategy, "default", StrategyDisaggregate, StrategyColocate); err != nil {
			return false, err
		}
		if err := pick("env_strategy", &out.EnvStrategy, EnvStrategyDefault, EnvStrategyDeviceColocate); err != nil {
			return false, err
		}
	}
	pools = out.Mode == ModeManual || out.Strategy != "default"
	if out.Strategy == "default" {
		// rlightning's default strategy makes no pools: Ray places every
		// worker where it fits. Planning it needs pools; disaggregate is
		// poolplanner's default.
		if out.Mode == ModeAuto {
			c.assumed = append(c.assumed, Default{Field: field + ".strategy", Value: StrategyDisaggregate,
				Why: `rlightning's "default" makes no pools and leaves placement to Ray`})
		}
		out.Strategy = StrategyDisaggregate
	}
	return pools, nil
}

func (c *rlConv) resourcePool(field string, v any, r *rlScheduling) error {
	if v == nil {
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		return fieldErr(field, "want a list of pools, got %s", kindOf(v))
	}
	if err := resolvedAll(field, v); err != nil {
		return err
	}
	r.poolList = list
	return nil
}

func (c *rlConv) envGroups(v any) ([]rlGroup, error) {
	var list []any
	switch x := v.(type) {
	case nil:
		c.assumed = append(c.assumed, Default{Field: "env", Value: "[{num_workers: 1, num_cpus: 1, num_gpus: 0.0}]"})
		return []rlGroup{{workers: 1, cpus: 1}}, nil
	case map[string]any:
		if namedEnvs(x) {
			return nil, fieldErr("env", "a mapping of env configs by name; rlightning takes a list of env configs (env: [{name: ..., num_workers: ...}]) or a single one")
		}
		list = []any{x}
	case []any:
		list = x
	default:
		return nil, fieldErr("env", "want a list of env configs, got %s", kindOf(v))
	}
	if len(list) > plan.MaxGroups {
		return nil, fieldErr("env", "%d env configs; at most %d", len(list), plan.MaxGroups)
	}
	out := make([]rlGroup, 0, len(list))
	for i, raw := range list {
		field := fmt.Sprintf("env[%d]", i)
		if _, single := v.(map[string]any); single {
			field = "env"
		}
		m, ok := raw.(map[string]any)
		if !ok {
			return nil, fieldErr(field, "want a mapping (an env config), got %s", kindOf(raw))
		}
		if err := c.sortOut(field+".", m, []string{"num_workers", "num_cpus", "num_gpus"}, rlEnvFields); err != nil {
			return nil, err
		}
		var g rlGroup
		var err error
		if g.workers, _, err = rlWhole(field+".num_workers", m, 1, false); err != nil {
			return nil, err
		}
		// EnvConfig.num_cpus is an int: rlightning refuses 0.5.
		cpus, _, err := rlWhole(field+".num_cpus", m, 1, false)
		if err != nil {
			return nil, err
		}
		if cpus > MaxCPUs {
			return nil, fieldErr(field+".num_cpus", "%d is not allowed; want a whole number from 0 to %d", cpus, int(MaxCPUs))
		}
		g.cpus = float64(cpus)
		if g.gpus, err = rlGPUs(field+".num_gpus", m, 0); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// namedEnvs says whether m looks like env configs keyed by name, not
// one env config: every value a mapping, no key a field of EnvConfig.
func namedEnvs(m map[string]any) bool {
	if len(m) == 0 {
		return false
	}
	for k, v := range m {
		if _, ok := v.(map[string]any); !ok || contains(rlEnvFields, k) {
			return false
		}
	}
	return true
}

func (c *rlConv) bufferGroup(v any, r *rlScheduling) error {
	storage := map[string]any{}
	switch x := v.(type) {
	case nil:
		c.assumed = append(c.assumed, Default{Field: "buffer.storage", Value: "{type: unified, device: cpu}"})
	case map[string]any:
		if err := c.sortOut("buffer.", x, []string{"storage"}, rlBufferFields); err != nil {
			return err
		}
		switch s := x["storage"].(type) {
		case nil:
		case map[string]any:
			storage = s
		default:
			return fieldErr("buffer.storage", "want a mapping with type and device, got %s", kindOf(s))
		}
	default:
		return fieldErr("buffer", "want a mapping (rlightning's buffer group), got %s", kindOf(v))
	}
	kind, err := rlChoice("buffer.storage.type", storage, "unified", "unified", "sharded")
	if err != nil {
		return err
	}
	device, err := rlChoice("buffer.storage.device", storage, "cpu", "cpu", "cuda")
	if err != nil {
		return err
	}
	used := []string{"type", "device"}
	if kind == "sharded" {
		used = append(used, "num_shards")
	}
	if err := c.sortOut("buffer.storage.", storage, used, rlStorageFields); err != nil {
		return err
	}
	switch {
	case kind == "sharded" && device == "cuda":
		return fieldErr("buffer.storage.device", "cuda is not allowed with type sharded: rlightning's sharded storage only supports cpu")
	case kind == "unified":
		r.buffer.workers, r.buffer.auto = 1, false
	default:
		if _, ok := storage["num_shards"]; ok {
			n, _, err := rlWhole("buffer.storage.num_shards", storage, 1, false)
			if err != nil {
				return err
			}
			if n < 1 {
				return fieldErr("buffer.storage.num_shards", "%d is not allowed; want a whole number >= 1 (one buffer worker per shard)", n)
			}
			r.buffer.workers, r.buffer.auto = n, false
		}
	}
	if device == "cuda" {
		r.buffer.gpus = 1
	}
	return nil
}

// rewritten refuses a config.validated.yaml of a job with pools: rlightning
// writes it after planning, once validate_config_for_placement has set
// every env's num_gpus to 0.1 and num_cpus to 1 (and train_each_gpu_num,
// eval_each_gpu_num to 0.1), so what the env asked for is lost.
func (c *rlConv) rewritten(groups map[string]any, r *rlScheduling) error {
	cl, _ := groups["cluster"].(map[string]any)
	if cl == nil || len(r.env) == 0 || !r.pools {
		return nil
	}
	if _, given := groups["env"]; !given {
		return nil
	}
	for _, k := range []string{"train_each_gpu_num", "eval_each_gpu_num"} {
		if n, ok := number(cl[k]); !ok || n != 0.1 {
			return nil
		}
	}
	for _, g := range r.env {
		if g.gpus != 0.1 || g.cpus != 1 {
			return nil
		}
	}
	return fieldErr("env[0].num_gpus", "0.1, with train_each_gpu_num and eval_each_gpu_num 0.1: this is rlightning's config.validated.yaml, written after planning with every env's num_gpus rewritten to 0.1, not what the job asks for; give the config as composed: .hydra/config.yaml beside it in the same run's output directory, or `python train.py ... --cfg job --resolve`; or set each env's num_gpus and %strain_each_gpu_num to what it asks", c.cluster)
}

// nativeErr names the rlightning field of a refusal of the translation.
func (c *rlConv) nativeErr(err error) error {
	fe, ok := err.(*FieldError)
	if !ok {
		return fmt.Errorf("the poolplanner spec it stands for: %w", err)
	}
	if strings.HasPrefix(fe.Field, "resource_pool") {
		return &FieldError{Field: c.cluster + fe.Field, Msg: fe.Msg}
	}
	return &FieldError{Field: "spec", Msg: "the poolplanner spec it stands for is refused: " + fe.Error()}
}

// resolved refuses a field that matters holding what Hydra had yet to
// fill in.
func resolved(field string, v any) error {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	if strings.Contains(s, "${") {
		return fieldErr(field, "%q is an unresolved interpolation; poolplanner reads resolved configs: print the job config with --cfg job --resolve, or write the value", clip(s))
	}
	if strings.TrimSpace(s) == "???" {
		return fieldErr(field, "??? (a value Hydra marks missing) is not allowed; give it a value")
	}
	return nil
}

// resolvedAll is resolved for every string within v.
func resolvedAll(field string, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := resolvedAll(field+"."+k, x[k]); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := resolvedAll(fmt.Sprintf("%s[%d]", field, i), e); err != nil {
				return err
			}
		}
	default:
		return resolved(field, v)
	}
	return nil
}

// rlWhole reads field key of m as pydantic reads an int: a whole number,
// also written as a float (4.0) or a string ("4"); def when absent;
// "auto" when allowAuto.
func rlWhole(field string, m map[string]any, def int, allowAuto bool) (n int, auto bool, err error) {
	key := field[strings.LastIndexByte(field, '.')+1:]
	raw, ok := m[key]
	if !ok {
		return def, false, nil
	}
	if err := resolved(field, raw); err != nil {
		return 0, false, err
	}
	want := "a whole number >= 0"
	if allowAuto {
		want += ` or "auto"`
	}
	if s, ok := raw.(string); ok {
		if allowAuto && s == "auto" {
			return 0, true, nil
		}
		if i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
			raw = int64(i)
		}
	}
	x, ok := number(raw)
	if !ok || x < 0 || x != math.Trunc(x) {
		return 0, false, fieldErr(field, "%s is not allowed; want %s", showRL(raw), want)
	}
	if x > MaxWorkers {
		return 0, false, fieldErr(field, "%v is more than a plan holds; want at most %d", raw, MaxWorkers)
	}
	return int(x), false, nil
}

// rlGPUs reads a count of GPUs per worker (a float in rlightning) as the
// native spec allows it: a fraction in (0, 1], a whole number, or 0.
func rlGPUs(field string, m map[string]any, def float64) (float64, error) {
	key := field[strings.LastIndexByte(field, '.')+1:]
	raw, ok := m[key]
	if !ok {
		return def, nil
	}
	if err := resolved(field, raw); err != nil {
		return 0, err
	}
	if s, ok := raw.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			raw = f
		}
	}
	x, ok := number(raw)
	if !ok || x < 0 || math.IsInf(x, 0) || x > 1e6 {
		return 0, fieldErr(field, "%s is not allowed; want a fraction in (0, 1], a whole number up to 1000000, or 0", showRL(raw))
	}
	if x > 1 && x != math.Trunc(x) {
		return 0, fieldErr(field, "%v is not allowed: above 1 a worker takes whole GPUs; want a fraction in (0, 1] or a whole number", raw)
	}
	return x, nil
}

// rlChoice reads one of a Literal's values.
func rlChoice(field string, m map[string]any, def string, allowed ...string) (string, error) {
	key := field[strings.LastIndexByte(field, '.')+1:]
	raw, ok := m[key]
	if !ok {
		return def, nil
	}
	if err := resolved(field, raw); err != nil {
		return "", err
	}
	s, ok := raw.(string)
	if !ok || !contains(allowed, s) {
		return "", fieldErr(field, "%s is not allowed; want one of %s", showRL(raw), strings.Join(allowed, ", "))
	}
	return s, nil
}

func showRL(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(clip(s))
	}
	if _, ok := v.(map[string]any); ok {
		return "a mapping"
	}
	if _, ok := v.([]any); ok {
		return "a list"
	}
	return show(v)
}

// nearMiss says whether key a is a likely typo of b: an edit or two
// away (one for short names), adjacent swaps counting one, or the same
// words in another order, plurals aside (num_train_workers).
func nearMiss(a, b string) bool {
	if a == b {
		return false
	}
	most := 2
	if len(b) <= 6 {
		most = 1
	}
	a = strings.ToLower(a)
	return editDistance(a, b) <= most || strings.Contains(b, "_") && sameWords(a, b)
}

func sameWords(a, b string) bool {
	words := func(s string) []string {
		w := strings.FieldsFunc(s, func(r rune) bool { return r == '_' || r == '-' })
		for i := range w {
			w[i] = strings.TrimSuffix(w[i], "s")
		}
		sort.Strings(w)
		return w
	}
	return slices.Equal(words(a), words(b))
}

// editDistance is the optimal string alignment distance of a and b.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// nativeYAML writes the poolplanner spec of r.
func (r *rlScheduling) nativeYAML() []byte {
	var b bytes.Buffer
	b.WriteString("scheduling:\n")
	for _, g := range []struct {
		name string
		g    rlGroup
	}{{"train", r.train}, {"eval", r.eval}, {"buffer", r.buffer}} {
		fmt.Fprintf(&b, "  %s: %s\n", g.name, g.g.flow())
	}
	if len(r.env) == 0 {
		b.WriteString("  env: []\n")
	} else {
		b.WriteString("  env:\n")
		for _, g := range r.env {
			fmt.Fprintf(&b, "    - %s\n", g.flow())
		}
	}
	p := r.placement
	if p.Mode == ModeManual {
		// The pools say where everything goes; a strategy means nothing.
		fmt.Fprintf(&b, "placement: {mode: manual, env_strategy: %s}\n", p.EnvStrategy)
	} else {
		fmt.Fprintf(&b, "placement: {mode: %s, strategy: %s, env_strategy: %s}\n", p.Mode, p.Strategy, p.EnvStrategy)
	}
	if r.poolList != nil {
		b.WriteString("resource_pool:")
		if len(r.poolList) == 0 {
			b.WriteString(" []\n")
		} else {
			b.WriteString("\n")
			b.Write(poolsYAML(r.poolList))
		}
	}
	return b.Bytes()
}

func (g rlGroup) flow() string {
	n := strconv.Itoa(g.workers)
	if g.auto {
		n = "auto"
	}
	return fmt.Sprintf("{worker_num: %s, num_cpus: %s, num_gpus: %s}", n, fmtNum(g.cpus), fmtNum(g.gpus))
}

func fmtNum(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// poolKeyOrder is the order rlightning's files give a pool's keys in.
var poolKeyOrder = []string{"name", "num_node", "num_gpus", "node_ids", "train", "eval", "env", "buffer", "worker_counts"}

// poolsYAML writes rlightning's pool list as it was given, its keys in
// rlightning's order, each pool's index strings quoted.
func poolsYAML(pools []any) []byte {
	seq := &yaml.Node{Kind: yaml.SequenceNode}
	for _, p := range pools {
		m, ok := p.(map[string]any)
		if !ok {
			var n yaml.Node
			_ = n.Encode(p)
			seq.Content = append(seq.Content, &n)
			continue
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		rank := func(k string) int {
			for i, o := range poolKeyOrder {
				if o == k {
					return i
				}
			}
			return len(poolKeyOrder)
		}
		sort.Slice(keys, func(i, j int) bool {
			ri, rj := rank(keys[i]), rank(keys[j])
			if ri != rj {
				return ri < rj
			}
			return keys[i] < keys[j]
		})
		mn := &yaml.Node{Kind: yaml.MappingNode}
		for _, k := range keys {
			var kn, vn yaml.Node
			_ = kn.Encode(k)
			_ = vn.Encode(m[k])
			if s, ok := m[k].(string); ok && (k == "train" || k == "eval" || k == "env" || k == "buffer") {
				vn = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
			}
			mn.Content = append(mn.Content, &kn, &vn)
		}
		seq.Content = append(seq.Content, mn)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	_ = enc.Encode(seq)
	_ = enc.Close()
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if line != "" {
			out.WriteString("  " + line)
		}
	}
	return out.Bytes()
}

// flowYAML writes v on one line, for a message.
func flowYAML(v any) string {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	setFlow(&n)
	b, err := yaml.Marshal(&n)
	if err != nil {
		return fmt.Sprint(v)
	}
	return clip(strings.TrimSpace(string(b)))
}

func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
	for _, c := range n.Content {
		setFlow(c)
	}
}
