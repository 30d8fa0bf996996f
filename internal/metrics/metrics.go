// Package metrics is what poolplanner's processes tell Prometheus: the
// planner's plans, replans, inventory and requests, the reporter's puts
// and errors. Each process has a registry of its own (no global state),
// served at /metrics on --metrics-listen.
package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Planner is the planner service's metrics. A nil *Planner records
// nothing.
type Planner struct {
	revision, valid, workers, gpus, leader *prometheus.GaugeVec
	priority, preempted                    *prometheus.GaugeVec
	drained                                *prometheus.GaugeVec
	moved                                  *prometheus.CounterVec
	replan, changeToPublish                *prometheus.HistogramVec
	nodes, unhealthy, conflicts            prometheus.Gauge
	rejected, resyncs, claims              *prometheus.CounterVec
	watchFailures                          *prometheus.CounterVec
	watchFailing                           *prometheus.GaugeVec
	requests                               *prometheus.CounterVec
	latency                                *prometheus.HistogramVec
	// elastic is each elastic group's workers now; resized counts its
	// grows and shrinks.
	elastic *prometheus.GaugeVec
	resized *prometheus.CounterVec
	// startRetries counts failed starts retried, by cause.
	startRetries *prometheus.CounterVec
}

// NewPlanner makes the planner's metrics, registered on reg.
func NewPlanner(reg prometheus.Registerer) *Planner {
	f := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "poolplanner_" + name, Help: help}, labels)
		reg.MustRegister(g)
		return g
	}
	m := &Planner{
		revision:  f("plan_revision", "The plan's latest revision.", "plan"),
		valid:     f("plan_valid", "1 when the plan's latest revision is valid, else 0.", "plan"),
		workers:   f("plan_workers", "Workers the plan's latest revision places.", "plan"),
		gpus:      f("plan_gpus", "GPUs the plan's latest revision holds (fractional shares summed).", "plan"),
		leader:    f("plan_leader", "1 while this planner holds the plan's lease (it replans and publishes), else 0.", "plan"),
		priority:  f("plan_priority", "The plan's priority among the plans sharing the cluster.", "plan"),
		drained:   f("drained_gpus", "GPUs out of placement on purpose, by cause: operator (planner drain, deadline passed or none), leaving (planner drain whose --deadline has not passed: no new work, its workers still there), flapping (turned unhealthy too often: held out until an undrain), probation (recovered a moment ago).", "cause"),
		preempted: f("plan_preempted", "1 while the plan's latest revision gave way to a plan of higher priority, else 0.", "plan"),
		elastic:   f("plan_elastic_workers", "Workers an elastic group (worker_num {min, max}) of the plan's latest revision holds, by component (eval, env or env[i]).", "plan", "component"),
		resized: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_plan_elastic_resizes_total",
			Help: "Revisions that resized an elastic group, by component and direction (grow or shrink)."}, []string{"plan", "component", "direction"}),
		startRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_start_retries_total",
			Help: "Starts (making the streams and buckets, reading the latest plan) that failed and are retried, by cause: unavailable (JetStream away, or a request refused or unanswered), forming (fewer JetStream servers than --replicas so far: retried for a minute after start, as a cluster may still be forming)."}, []string{"cause"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_plan_workers_moved_total",
			Help: "Workers moved by the plan's revisions, summed."}, []string{"plan"}),
		replan: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "poolplanner_replan_duration_seconds",
			Help: "Time to plan and publish a revision.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"plan"}),
		changeToPublish: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "poolplanner_inventory_change_to_publish_seconds",
			Help: "Time from the first inventory change a revision answers to its publish.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"plan"}),
		nodes:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "poolplanner_inventory_nodes", Help: "Nodes in the live inventory."}),
		unhealthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "poolplanner_inventory_unhealthy_gpus", Help: "Unhealthy GPUs in the live inventory."}),
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "poolplanner_gpu_uuid_conflicts",
			Help: "GPUs refused to their node (marked unhealthy) because another node reported their UUID first."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_inventory_rejected_total",
			Help: "Inventory documents rejected (the node is out of the plan), by reason: unparsable (not JSON), invalid (impossible values), key_mismatch (a node_id other than its key)."}, []string{"reason"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_inventory_resyncs_total",
			Help: "Re-reads of the whole inventory, by why: reconnect (NATS came back), stalled_watch (the watch fell behind the stream), lost_state (the planner's streams were gone), watch_ended (the watch ended by itself and was made again)."}, []string{"why"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_gpu_uuid_claims_total",
			Help: "GPU UUID claim decisions said, by outcome: refused (a node reported a UUID another holds; said again when its document changes while refused), handover (a UUID passed to the next node that reported it). poolplanner_gpu_uuid_conflicts is the state now."}, []string{"outcome"}),
		watchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_watch_failures_total",
			Help: "Watches the planner could not make (the server refused the consumer: its cap reached, permissions, the stream gone), by watch: inventory, specs."}, []string{"watch"}),
		watchFailing: f("watch_failing", "1 while the planner's last try to make the watch failed (it plans blind to what the watch would deliver), else 0.", "watch"),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_requests_total",
			Help: "Requests answered, by endpoint and code (200 ok, else the error's)."}, []string{"endpoint", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "poolplanner_request_duration_seconds",
			Help: "Time to answer a request, by endpoint.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"endpoint"}),
	}
	reg.MustRegister(m.startRetries, m.moved, m.resized, m.replan, m.changeToPublish, m.nodes, m.unhealthy, m.conflicts,
		m.rejected, m.resyncs, m.claims, m.watchFailures, m.requests, m.latency)
	return m
}

// Published records a revision of plan: its number, validity, workers,
// GPUs held and workers moved.
func (m *Planner) Published(plan string, revision int, valid bool, workers int, gpus float64, moved int) {
	if m == nil {
		return
	}
	m.revision.WithLabelValues(plan).Set(float64(revision))
	m.valid.WithLabelValues(plan).Set(b2f(valid))
	m.workers.WithLabelValues(plan).Set(float64(workers))
	m.gpus.WithLabelValues(plan).Set(gpus)
	m.moved.WithLabelValues(plan).Add(float64(moved))
}

// Elastic records an elastic group's workers in the plan's latest
// revision.
func (m *Planner) Elastic(plan, component string, workers int) {
	if m == nil {
		return
	}
	m.elastic.WithLabelValues(plan, component).Set(float64(workers))
}

// Resized counts a revision that grew or shrank an elastic group.
func (m *Planner) Resized(plan, component string, grew bool) {
	if m == nil {
		return
	}
	dir := "shrink"
	if grew {
		dir = "grow"
	}
	m.resized.WithLabelValues(plan, component, dir).Inc()
}

// Shared records where a plan stands among those sharing the cluster:
// its priority, and whether its latest revision gave way to another.
func (m *Planner) Shared(plan string, priority int, preempted bool) {
	if m == nil {
		return
	}
	m.priority.WithLabelValues(plan).Set(float64(priority))
	m.preempted.WithLabelValues(plan).Set(b2f(preempted))
}

// Removed forgets a plan whose spec was removed: every series of the
// plan ends (its gauges, whether this planner leads it, workers moved,
// replan and change-to-publish times).
func (m *Planner) Removed(plan string) {
	if m == nil {
		return
	}
	for _, g := range []*prometheus.GaugeVec{m.revision, m.valid, m.workers, m.gpus, m.leader, m.priority, m.preempted} {
		g.DeleteLabelValues(plan)
	}
	m.moved.DeleteLabelValues(plan)
	m.elastic.DeletePartialMatch(prometheus.Labels{"plan": plan})
	m.resized.DeletePartialMatch(prometheus.Labels{"plan": plan})
	m.replan.DeleteLabelValues(plan)
	m.changeToPublish.DeleteLabelValues(plan)
}

// Replanned records a replan's duration and, when it published and an
// inventory change started it, the time since that change.
func (m *Planner) Replanned(plan string, took, sinceChange time.Duration) {
	if m == nil {
		return
	}
	m.replan.WithLabelValues(plan).Observe(took.Seconds())
	if sinceChange > 0 {
		m.changeToPublish.WithLabelValues(plan).Observe(sinceChange.Seconds())
	}
}

// Inventory records the live inventory's size, and its GPUs refused
// because another node holds their UUID.
func (m *Planner) Inventory(nodes, unhealthy, conflicts int) {
	if m == nil {
		return
	}
	m.nodes.Set(float64(nodes))
	m.unhealthy.Set(float64(unhealthy))
	m.conflicts.Set(float64(conflicts))
}

// Drained records how many GPUs are out of placement on purpose, by
// cause (operator, leaving, flapping, probation); every cause is set,
// zero included.
func (m *Planner) Drained(byCause map[string]int) {
	if m == nil {
		return
	}
	for _, c := range []string{"operator", "leaving", "flapping", "probation"} {
		m.drained.WithLabelValues(c).Set(float64(byCause[c]))
	}
}

// Watched records a try to make one of the planner's watches (inventory,
// specs): failed or not.
func (m *Planner) Watched(watch string, failed bool) {
	if m == nil {
		return
	}
	if failed {
		m.watchFailures.WithLabelValues(watch).Inc()
	}
	m.watchFailing.WithLabelValues(watch).Set(b2f(failed))
}

// Rejected records an inventory document rejected for reason, one of
// a fixed few kinds (unparsable, invalid, key_mismatch); never the node,
// whose ids are unbounded.
func (m *Planner) Rejected(reason string) {
	if m != nil {
		m.rejected.WithLabelValues(reason).Inc()
	}
}

// StartRetried records a failed start that will be tried again, and its
// cause (unavailable, forming).
func (m *Planner) StartRetried(cause string) {
	if m != nil {
		m.startRetries.WithLabelValues(cause).Inc()
	}
}

// Resynced records a re-read of the whole inventory, and why
// (reconnect, stalled_watch, lost_state, watch_ended).
func (m *Planner) Resynced(why string) {
	if m != nil {
		m.resyncs.WithLabelValues(why).Inc()
	}
}

// Claimed records GPU UUID claim decisions: refused GPUs, and UUIDs
// handed over to the next node that reports them.
func (m *Planner) Claimed(refused, handovers int) {
	if m == nil {
		return
	}
	if refused > 0 {
		m.claims.WithLabelValues("refused").Add(float64(refused))
	}
	if handovers > 0 {
		m.claims.WithLabelValues("handover").Add(float64(handovers))
	}
}

// Leading records whether this planner leads plan.
func (m *Planner) Leading(plan string, leading bool) {
	if m == nil {
		return
	}
	m.leader.WithLabelValues(plan).Set(b2f(leading))
}

// Request records one answered request.
func (m *Planner) Request(endpoint, code string, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(endpoint, code).Inc()
	m.latency.WithLabelValues(endpoint).Observe(took.Seconds())
}

// Reporter is the reporter's metrics. A nil *Reporter records nothing.
type Reporter struct {
	puts, errors *prometheus.CounterVec
}

// NewReporter makes the reporter's metrics, registered on reg.
func NewReporter(reg prometheus.Registerer) *Reporter {
	m := &Reporter{
		puts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_reporter_puts_total",
			Help: "Inventory puts stored, by kind (change or heartbeat)."}, []string{"kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "poolplanner_reporter_errors_total",
			Help: "Reporter failures, by what failed (publish: a put NATS did not store; inventory: reading the GPUs, NVML's errors included)."}, []string{"what"}),
	}
	reg.MustRegister(m.puts, m.errors)
	return m
}

// Put records a stored put of kind "change" or "heartbeat".
func (m *Reporter) Put(kind string) {
	if m != nil {
		m.puts.WithLabelValues(kind).Inc()
	}
}

// Failed records a failure of what ("publish", "inventory").
func (m *Reporter) Failed(what string) {
	if m != nil {
		m.errors.WithLabelValues(what).Inc()
	}
}

// Server is the embedded NATS server's metrics (serve without
// --server). A nil *Server records nothing.
type Server struct {
	dropped prometheus.Counter
}

// NewServer makes the embedded server's metrics, registered on reg.
func NewServer(reg prometheus.Registerer) *Server {
	m := &Server{dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "poolplanner_nats_requests_dropped_total",
		Help: "JetStream API requests the embedded NATS server dropped unanswered, its request queue full (each a read or put its client timed out on and retried)."})}
	reg.MustRegister(m.dropped)
	return m
}

// Dropped records n requests the server dropped.
func (m *Server) Dropped(n int64) {
	if m != nil {
		m.dropped.Add(float64(n))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NewRegistry is a registry with the Go runtime's and the process's
// collectors, for one process.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Serve serves reg at /metrics on addr (HOST:PORT) until ctx ends. A
// taken address is an error at once.
func Serve(ctx context.Context, addr string, reg *prometheus.Registry) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() { _ = srv.Serve(l) }() // ends at Shutdown
	return nil
}

// UnplannedUse registers poolplanner_gpus_unplanned_use: the GPUs that
// run processes though no worker is placed on them, counted by count
// when scraped (a worker a revision moved away still running, or work
// started outside poolplanner).
func UnplannedUse(reg prometheus.Registerer, count func() int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "poolplanner_gpus_unplanned_use",
		Help: "GPUs running processes though no worker of any plan is placed on them.",
	}, func() float64 { return float64(count()) }))
}

// Health is what the planner's health gauges read when scraped.
type Health struct {
	// StoodDown: the planner gave up its lease after failing writes.
	StoodDown bool
	// Failures is replans failed in a row.
	Failures int
	// Stuck: the loop made no progress within its bound.
	Stuck bool
	// Problems counts what the planner finds wrong (a spec it cannot
	// read, say).
	Problems int
}

// PlannerHealth registers poolplanner_planner_stood_down,
// poolplanner_replan_failures, poolplanner_loop_stuck and
// poolplanner_planner_problems, read from health when scraped.
func PlannerHealth(reg prometheus.Registerer, health func() Health) {
	for _, g := range []struct {
		name, help string
		value      func(Health) float64
	}{
		{"poolplanner_planner_stood_down", "1 while the planner stays out of leading after its writes failed.", func(h Health) float64 { return b2f(h.StoodDown) }},
		{"poolplanner_replan_failures", "Replans failed in a row.", func(h Health) float64 { return float64(h.Failures) }},
		{"poolplanner_loop_stuck", "1 while the planner's loop makes no progress within its bound (it then stops renewing its lease).", func(h Health) float64 { return b2f(h.Stuck) }},
		{"poolplanner_planner_problems", "What the planner finds wrong: a spec it cannot read, a watch that delivers nothing, a stand-down.", func(h Health) float64 { return float64(h.Problems) }},
	} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help}, func() float64 { return g.value(health()) }))
	}
}
