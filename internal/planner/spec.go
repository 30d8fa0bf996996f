package planner

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/poolplanner/poolplanner/plan"
)

// Placement modes, strategies and env strategies, spelled as in rlightning.
const (
	ModeAuto   = "auto"
	ModeManual = "manual"

	StrategyDisaggregate = "disaggregate"
	StrategyColocate     = "colocate"

	EnvStrategyDefault        = "default"
	EnvStrategyDeviceColocate = "device-colocate"
)

// WorkerGroup is one scheduling entry: how many workers and what each needs.
type WorkerGroup struct {
	WorkerNum int
	// Auto is set when worker_num is "auto" (buffer only): one worker per
	// node that hosts train workers.
	Auto bool
	// Min and Max, Max above 0, make the group elastic (eval and the
	// last env entry only; worker_num {min: M, max: N}): it holds at least
	// Min workers and grows to Max into GPUs nobody needs. WorkerNum is
	// then the workers it is planned with now, Min when parsed (elastic.go).
	Min     int `json:",omitempty"`
	Max     int `json:",omitempty"`
	NumCPUs float64
	NumGPUs float64
	// Constraints say where its workers may run (nil: anywhere).
	*Constraints
}

// Scheduling is the job's worker groups. A nil group schedules nothing.
type Scheduling struct {
	Train  *WorkerGroup
	Eval   *WorkerGroup
	Buffer *WorkerGroup
	Env    []WorkerGroup
}

// Placement says how pools are formed.
type Placement struct {
	Mode        string
	Strategy    string
	EnvStrategy string
}

// PoolConfig is one entry of rlightning's manual `resource_pool` list.
type PoolConfig struct {
	Name    string
	NumNode int
	// NumGPUs holds one value for every node, or one per node.
	NumGPUs     []int
	NumGPUsList bool
	NodeIDs     []string
	// Ranges are pool-global GPU index ranges per component.
	Ranges map[plan.Component][]plan.Range
	// WorkerCounts, poolplanner's addition to rlightning's format, says per
	// component how many of its workers go on each node of the pool, per
	// scheduling group ([node][group]); a component it names is placed by
	// these counts instead of rlightning's packing.
	WorkerCounts map[plan.Component][][]int
}

// Spec is a job spec: its scheduling, its placement and, in manual mode,
// its resource pools.
type Spec struct {
	Scheduling   Scheduling
	Placement    Placement
	ResourcePool []PoolConfig
	// Priority orders plans sharing a cluster (PlanAll): higher first;
	// a lower plan gives way to a higher one. 0 by default.
	Priority int `json:",omitempty"`
	// MaxGPUs, when above 0, is the most GPUs the plan may hold (each
	// GPU it uses, wholly or in part, counts once).
	MaxGPUs int `json:",omitempty"`
}

// MaxPriority bounds a spec's priority either way.
const MaxPriority = 1_000_000_000

// MaxCPUs bounds a count of CPUs, a node's or a worker's: no machine has
// more, and sums of them stay far from overflowing.
const MaxCPUs = 1e9

// MaxWorkers bounds the workers one spec may ask for: every worker is
// planned and recorded, and a plan of two million workers already takes
// about 300 MB. (Twenty thousand 8-GPU nodes running env workers at a
// quarter GPU each are 640,000.)
const MaxWorkers = 2_000_000

// MaxNodeWorkers bounds, with the nodes of the inventory, the workers one
// plan may ask for: at most this many times the nodes, whatever each
// worker needs (the bound is on the plan, not on any one node). A worker
// asking for no GPU and no CPU would otherwise fit any node any number
// of times, and a 70-byte spec could make the planner build, store and
// publish millions of workers on a handful of nodes. (An 8-GPU node of
// quarter-GPU env workers holds 32; a 256-CPU node of quarter-CPU workers
// 1,024.) A degraded replan, keeping a placement this very spec had on a
// cluster that held it, is not refused by it.
const MaxNodeWorkers = 1024

// AskedWorkers is how many workers the spec asks for, buffer included
// ("auto" counts none): the most a plan of it places.
func (s *Spec) AskedWorkers() int {
	n := 0
	sc := s.Scheduling
	for _, g := range append([]*WorkerGroup{sc.Train, sc.Eval, sc.Buffer}, envPtrs(sc.Env)...) {
		if g != nil {
			n += max(g.WorkerNum, 0)
		}
	}
	return n
}

// overBound refuses a spec asking for more workers (buffer included)
// than nodes nodes hold at MaxNodeWorkers each, naming the largest
// group's worker_num.
func overBound(s *Spec, nodes int) error {
	total, largest, field := s.AskedWorkers(), -1, "scheduling"
	add := func(f string, g *WorkerGroup) {
		if g == nil || g.WorkerNum <= 0 {
			return
		}
		if g.WorkerNum > largest {
			largest, field = g.WorkerNum, f+".worker_num"
		}
	}
	sc := s.Scheduling
	add("scheduling.train", sc.Train)
	add("scheduling.eval", sc.Eval)
	add("scheduling.buffer", sc.Buffer)
	for i := range sc.Env {
		f := "scheduling.env"
		if len(sc.Env) > 1 {
			f = fmt.Sprintf("scheduling.env[%d]", i)
		}
		add(f, &sc.Env[i])
	}
	limit := nodes * MaxNodeWorkers
	if nodes == 0 && total <= MaxNodeWorkers {
		return nil // on no nodes at all the GPUs or CPUs asked for say it better
	}
	if total > limit {
		return &PlanError{Msg: fmt.Sprintf("%s: %d workers in all, more than this cluster can hold: %d %s at most %d workers each, %d in all",
			field, total, nodes, plural(nodes, "node", "nodes"), MaxNodeWorkers, limit)}
	}
	return nil
}

func envPtrs(env []WorkerGroup) []*WorkerGroup {
	out := make([]*WorkerGroup, len(env))
	for i := range env {
		out[i] = &env[i]
	}
	return out
}

// FieldError is a spec error that names the offending field and what is
// allowed there.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ParseSpec reads a job spec written in YAML or JSON (JSON is read as YAML),
// in time linear in its size (see DecodeYAML): a key given twice in one
// mapping is refused.
func ParseSpec(data []byte) (*Spec, error) {
	raw, err := DecodeYAML(data)
	if err != nil {
		if _, ok := err.(*FieldError); ok {
			return nil, err
		}
		return nil, fmt.Errorf("spec is not valid YAML or JSON: %s", oneLine(err.Error()))
	}
	if raw == nil {
		return nil, fieldErr("spec", "empty; want a mapping with scheduling and placement")
	}
	top, ok := raw.(map[string]any)
	if !ok {
		return nil, fieldErr("spec", "want a mapping with scheduling and placement, got %s", kindOf(raw))
	}
	if err := onlyKeys("spec", top, "scheduling", "placement", "resource_pool", "priority", "max_gpus"); err != nil {
		return nil, err
	}
	s := &Spec{}
	if err := parseSharing(top, s); err != nil {
		return nil, err
	}
	if err := parseScheduling(top["scheduling"], &s.Scheduling); err != nil {
		return nil, err
	}
	if err := parsePlacement(top["placement"], &s.Placement); err != nil {
		return nil, err
	}
	pools, err := parsePools(top["resource_pool"])
	if err != nil {
		return nil, err
	}
	s.ResourcePool = pools
	total := 0
	for _, g := range append([]*WorkerGroup{s.Scheduling.Train, s.Scheduling.Eval}, envPtrs(s.Scheduling.Env)...) {
		if g != nil {
			total += max(g.WorkerNum, g.Max)
		}
	}
	if err := checkElastic(s); err != nil {
		return nil, err
	}
	if total > MaxWorkers {
		return nil, fieldErr("scheduling", "asks for %d workers in all; a plan holds at most %d", total, MaxWorkers)
	}
	if s.Placement.Mode == ModeManual && len(s.ResourcePool) == 0 && total > 0 {
		return nil, fieldErr("resource_pool", "placement.mode is manual but resource_pool is empty; list the pools, or use mode auto")
	}
	if s.Placement.Mode == ModeManual {
		if err := checkCounts(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// parseSharing reads what a plan sharing the cluster with others says:
// its priority and its quota.
func parseSharing(top map[string]any, s *Spec) error {
	if raw, ok := top["priority"]; ok && raw != nil {
		n, ok := number(raw)
		if !ok || n != math.Trunc(n) || math.Abs(n) > MaxPriority {
			return fieldErr("priority", "%s is not allowed; want a whole number from %d to %d (higher goes first; default 0)", show(raw), -MaxPriority, MaxPriority)
		}
		s.Priority = int(n)
	}
	if raw, ok := top["max_gpus"]; ok && raw != nil {
		n, ok := number(raw)
		if !ok || n != math.Trunc(n) || n < 1 || n > 1e9 {
			return fieldErr("max_gpus", "%s is not allowed; want a whole number of GPUs >= 1 (leave it out for no quota)", show(raw))
		}
		s.MaxGPUs = int(n)
	}
	return nil
}

// checkCounts checks the pools' worker_counts against the scheduling: a
// count per group of the component on every node, and, summed over the
// pools, every worker of every group.
func checkCounts(s *Spec) error {
	sc := s.Scheduling
	groups := [nComp][]WorkerGroup{groupList(sc.Train), groupList(sc.Eval), sc.Env}
	var sums [nComp][]int
	for ci := range sums {
		sums[ci] = make([]int, len(groups[ci]))
	}
	counted := [nComp]bool{}
	for i, pc := range s.ResourcePool {
		for ci, c := range plan.GPUComponents {
			counts := pc.WorkerCounts[c]
			if counts == nil {
				continue
			}
			counted[ci] = true
			field := fmt.Sprintf("resource_pool[%d].worker_counts.%s", i, c)
			if len(groups[ci]) == 0 {
				return fieldErr(field, "the spec schedules no %s workers", c)
			}
			for j, per := range counts {
				if len(per) != len(groups[ci]) {
					return fieldErr(fmt.Sprintf("%s[%d]", field, j), "gives %d counts; want one per scheduling group of %s (%d)", len(per), c, len(groups[ci]))
				}
				for gi, k := range per {
					sums[ci][gi] += k
				}
			}
		}
	}
	for ci, c := range plan.GPUComponents {
		for gi, g := range groups[ci] {
			if counted[ci] && sums[ci][gi] != g.WorkerNum {
				return fieldErr("resource_pool", "worker_counts place %d %s of %s; it asks for %d", sums[ci][gi], plural(sums[ci][gi], "worker", "workers"), groupName(c, gi), g.WorkerNum)
			}
		}
	}
	return nil
}

func parseScheduling(v any, out *Scheduling) error {
	if v == nil {
		return fieldErr("scheduling", "missing; want a mapping of train, eval, buffer and env")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fieldErr("scheduling", "want a mapping of train, eval, buffer and env, got %s", kindOf(v))
	}
	if err := onlyKeys("scheduling", m, "train", "eval", "buffer", "env"); err != nil {
		return err
	}
	for _, c := range []plan.Component{plan.Train, plan.Eval, plan.Buffer} {
		raw, ok := m[string(c)]
		if !ok || raw == nil {
			continue
		}
		g, err := parseGroup("scheduling."+string(c), raw, c == plan.Buffer, c == plan.Eval)
		if err != nil {
			return err
		}
		switch c {
		case plan.Train:
			out.Train = &g
		case plan.Eval:
			out.Eval = &g
		case plan.Buffer:
			out.Buffer = &g
		}
	}
	switch env := m["env"].(type) {
	case nil:
	case []any:
		if len(env) > plan.MaxGroups {
			return fieldErr("scheduling.env", "%d worker groups; at most %d", len(env), plan.MaxGroups)
		}
		for i, raw := range env {
			g, err := parseGroup(fmt.Sprintf("scheduling.env[%d]", i), raw, false, true)
			if err != nil {
				return err
			}
			out.Env = append(out.Env, g)
		}
	case map[string]any:
		g, err := parseGroup("scheduling.env", env, false, true)
		if err != nil {
			return err
		}
		out.Env = []WorkerGroup{g}
	default:
		return fieldErr("scheduling.env", "want a list of worker groups, got %s", kindOf(env))
	}
	return nil
}

// parseGroup reads one worker group; allowAuto: worker_num may be
// "auto" (buffer); allowRange: it may be {min, max} (eval, env).
func parseGroup(field string, v any, allowAuto, allowRange bool) (WorkerGroup, error) {
	g := WorkerGroup{NumCPUs: 1}
	m, ok := v.(map[string]any)
	if !ok {
		return g, fieldErr(field, "want a mapping with worker_num, num_cpus and num_gpus, got %s", kindOf(v))
	}
	if err := onlyKeys(field, m, "worker_num", "num_cpus", "num_gpus", "node_selector", "gpu_model", "min_gpu_memory_gb", "gpu_link", "nvlink_domain"); err != nil {
		return g, err
	}
	switch wn := m["worker_num"].(type) {
	case nil:
		return g, fieldErr(field+".worker_num", "missing; want a whole number >= 0")
	case string:
		if wn != "auto" {
			return g, fieldErr(field+".worker_num", "%q is not allowed; want a whole number >= 0%s", wn, autoHint(allowAuto))
		}
		if !allowAuto {
			return g, fieldErr(field+".worker_num", `"auto" is allowed only for buffer; want a whole number >= 0`)
		}
		g.Auto = true
	case map[string]any:
		if err := parseRange(field+".worker_num", wn, allowRange, &g); err != nil {
			return g, err
		}
	default:
		n, ok := number(wn)
		if !ok || n < 0 || n != math.Trunc(n) {
			return g, fieldErr(field+".worker_num", "%s is not allowed; want a whole number >= 0%s", show(wn), autoHint(allowAuto))
		}
		if n > MaxWorkers {
			return g, fieldErr(field+".worker_num", "%v is more than a plan holds; want at most %d", wn, MaxWorkers)
		}
		g.WorkerNum = int(n)
	}
	if raw, ok := m["num_cpus"]; ok && raw != nil {
		n, ok := number(raw)
		if !ok || n < 0 || n > MaxCPUs {
			return g, fieldErr(field+".num_cpus", "%s is not allowed; want a number from 0 to %d", show(raw), int(MaxCPUs))
		}
		g.NumCPUs = n
	}
	if raw, ok := m["num_gpus"]; ok && raw != nil {
		n, ok := number(raw)
		if !ok || n < 0 || math.IsInf(n, 0) || n > 1e6 {
			return g, fieldErr(field+".num_gpus", "%s is not allowed; want a fraction in (0, 1], a whole number up to 1000000, or 0", show(raw))
		}
		if n > 1 && n != math.Trunc(n) {
			return g, fieldErr(field+".num_gpus", "%v is not allowed: above 1 a worker takes whole GPUs; want a fraction in (0, 1] or a whole number", raw)
		}
		g.NumGPUs = n
	}
	c, err := parseConstraints(field, m, g.NumGPUs, allowAuto)
	if err != nil {
		return g, err
	}
	if c.any() {
		g.Constraints = c
	}
	return g, nil
}

func autoHint(allowAuto bool) string {
	if allowAuto {
		return ` or "auto"`
	}
	return ""
}

func parsePlacement(v any, out *Placement) error {
	*out = Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}
	if v == nil {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fieldErr("placement", "want a mapping with mode, strategy and env_strategy, got %s", kindOf(v))
	}
	if err := onlyKeys("placement", m, "mode", "strategy", "env_strategy"); err != nil {
		return err
	}
	pick := func(key string, dst *string, allowed ...string) error {
		raw, ok := m[key]
		if !ok || raw == nil {
			return nil
		}
		s, ok := raw.(string)
		if !ok || !contains(allowed, s) {
			return fieldErr("placement."+key, "%v is not allowed; want one of %s", raw, strings.Join(allowed, ", "))
		}
		*dst = s
		return nil
	}
	if err := pick("mode", &out.Mode, ModeAuto, ModeManual); err != nil {
		return err
	}
	if err := pick("strategy", &out.Strategy, StrategyDisaggregate, StrategyColocate); err != nil {
		return err
	}
	return pick("env_strategy", &out.EnvStrategy, EnvStrategyDefault, EnvStrategyDeviceColocate)
}

func parsePools(v any) ([]PoolConfig, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fieldErr("resource_pool", "want a list of pools, got %s", kindOf(v))
	}
	pools := make([]PoolConfig, 0, len(list))
	for i, raw := range list {
		p, err := parsePool(fmt.Sprintf("resource_pool[%d]", i), raw)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}

func parsePool(field string, v any) (PoolConfig, error) {
	p := PoolConfig{Ranges: map[plan.Component][]plan.Range{}}
	m, ok := v.(map[string]any)
	if !ok {
		return p, fieldErr(field, "want a mapping with name, num_node, num_gpus and index strings, got %s", kindOf(v))
	}
	if err := onlyKeys(field, m, "name", "num_node", "num_gpus", "node_ids", "train", "eval", "env", "buffer", "worker_counts"); err != nil {
		return p, err
	}
	name, ok := m["name"].(string)
	if !ok || name == "" {
		return p, fieldErr(field+".name", "missing; want the pool's name, such as train_pool")
	}
	p.Name = name
	n, ok := number(m["num_node"])
	if !ok || n < 1 || n != math.Trunc(n) || n > 1e7 {
		return p, fieldErr(field+".num_node", "%v is not allowed; want a whole number >= 1", m["num_node"])
	}
	p.NumNode = int(n)
	for _, parse := range []func(string, map[string]any, *PoolConfig) error{parseNumGPUs, parseNodeIDs, parseIndices} {
		if err := parse(field, m, &p); err != nil {
			return p, err
		}
	}
	return p, parseWorkerCounts(field+".worker_counts", m["worker_counts"], &p)
}

// parseNumGPUs reads num_gpus: one count for every node, or a list with
// one per node.
func parseNumGPUs(field string, m map[string]any, p *PoolConfig) error {
	g, isList := m["num_gpus"].([]any)
	if !isList {
		n, ok := number(m["num_gpus"])
		if !ok || n < 0 || n != math.Trunc(n) {
			return fieldErr(field+".num_gpus", "%v is not allowed; want a whole number of GPUs per node, or a list with one per node", m["num_gpus"])
		}
		p.NumGPUs = []int{int(n)}
		return nil
	}
	p.NumGPUsList = true
	for j, x := range g {
		n, ok := number(x)
		if !ok || n < 0 || n != math.Trunc(n) {
			return fieldErr(fmt.Sprintf("%s.num_gpus[%d]", field, j), "%v is not allowed; want a whole number >= 0", x)
		}
		p.NumGPUs = append(p.NumGPUs, int(n))
	}
	if len(p.NumGPUs) != p.NumNode {
		return fieldErr(field+".num_gpus", "lists %d nodes but num_node is %d", len(p.NumGPUs), p.NumNode)
	}
	return nil
}

// parseNodeIDs reads node_ids, distinct and one per node.
func parseNodeIDs(field string, m map[string]any, p *PoolConfig) error {
	raw, ok := m["node_ids"]
	if !ok || raw == nil {
		return nil
	}
	ids, ok := raw.([]any)
	if !ok {
		return fieldErr(field+".node_ids", "want a list of node ids, got %s", kindOf(raw))
	}
	seen := map[string]bool{}
	for j, x := range ids {
		s := fmt.Sprint(x)
		if seen[s] {
			return fieldErr(fmt.Sprintf("%s.node_ids[%d]", field, j), "node %q is listed twice", s)
		}
		seen[s] = true
		p.NodeIDs = append(p.NodeIDs, s)
	}
	if len(p.NodeIDs) != p.NumNode {
		return fieldErr(field+".node_ids", "lists %d nodes but num_node is %d", len(p.NodeIDs), p.NumNode)
	}
	return nil
}

// parseIndices reads each component's pool-global index string.
func parseIndices(field string, m map[string]any, p *PoolConfig) error {
	for _, c := range []plan.Component{plan.Train, plan.Eval, plan.Env, plan.Buffer} {
		raw, ok := m[string(c)]
		if !ok || raw == nil {
			continue
		}
		var s string
		switch x := raw.(type) {
		case string:
			s = x
		case int:
			s = fmt.Sprint(x)
		default:
			return fieldErr(field+"."+string(c), "want an index string such as \"0-7, 8-15\", got %s", kindOf(raw))
		}
		rs, err := plan.ParseIndexString(s)
		if err != nil {
			return fieldErr(field+"."+string(c), "%v", err)
		}
		if c == plan.Buffer {
			// rlightning places buffers beside train workers; a buffer range
			// carries no meaning, so only an empty one is accepted.
			if len(rs) > 0 {
				return fieldErr(field+".buffer", "buffer workers follow the train workers; give the GPUs to train instead")
			}
			continue
		}
		if len(rs) > 0 {
			p.Ranges[c] = rs
		}
	}
	return nil
}

// parseWorkerCounts reads worker_counts: a mapping of train, eval or env
// to a list with an entry per node of the pool, each a count (one
// scheduling group) or a list of counts, one per group.
func parseWorkerCounts(field string, v any, p *PoolConfig) error {
	if v == nil {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fieldErr(field, "want a mapping of train, eval or env to a count per node, got %s", kindOf(v))
	}
	if err := onlyKeys(field, m, "train", "eval", "env"); err != nil {
		return err
	}
	p.WorkerCounts = map[plan.Component][][]int{}
	for _, c := range plan.GPUComponents {
		raw, ok := m[string(c)]
		if !ok {
			continue
		}
		f := field + "." + string(c)
		list, ok := raw.([]any)
		if !ok {
			return fieldErr(f, "want a list with an entry per node, got %s", kindOf(raw))
		}
		if len(list) != p.NumNode {
			return fieldErr(f, "lists %d nodes but num_node is %d", len(list), p.NumNode)
		}
		counts := make([][]int, len(list))
		for i, x := range list {
			groups, isList := x.([]any)
			if !isList {
				groups = []any{x}
			}
			for j, g := range groups {
				n, ok := number(g)
				if !ok || n < 0 || n != math.Trunc(n) || n > MaxWorkers {
					return fieldErr(fmt.Sprintf("%s[%d]", f, i), "%s is not allowed in entry %d; want whole numbers of workers from 0 to %d", show(g), j, MaxWorkers)
				}
				counts[i] = append(counts[i], int(n))
			}
		}
		p.WorkerCounts[c] = counts
	}
	return nil
}

func onlyKeys(field string, m map[string]any, allowed ...string) error {
	var bad []string
	for k := range m {
		if !contains(allowed, k) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fieldErr(field, "unknown key %q; allowed: %s", bad[0], strings.Join(allowed, ", "))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		if math.IsNaN(x) {
			return 0, false
		}
		return x, true
	}
	return 0, false
}

// show writes a value a person gave, as they would: "nothing" for a YAML
// null, not Go's "<nil>".
func show(v any) string {
	if v == nil {
		return "nothing"
	}
	return fmt.Sprint(v)
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("the string %q", v)
	case bool:
		return "a boolean"
	case int, int64, uint64, float64:
		return fmt.Sprintf("the number %v", v)
	}
	return fmt.Sprintf("%T", v)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
