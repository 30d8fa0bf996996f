package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/gpumap"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/service"
	"github.com/poolplanner/poolplanner/internal/store"
)

// logger is the log --log-level and --log-format ask for.
func (o *serveOptions) logger(cmd *cobra.Command) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(o.logLevel)
	if err != nil || o.logLevel == "" {
		return zerolog.Nop(), usagef("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	format, err := logFormat(o.logFormat, cmd.Flags().Changed("log-format"), cmd.ErrOrStderr())
	if err != nil {
		return zerolog.Nop(), err
	}
	return newLogger(format, level, cmd.ErrOrStderr()), nil
}

// listenMap listens on --http-listen, if given, at start: a taken port
// is a usage error before anything runs.
func (o *serveOptions) listenMap() (net.Listener, error) {
	if o.httpListen == "" {
		return nil, nil
	}
	l, err := gpumap.Listen(o.httpListen)
	if err != nil {
		return nil, usageError{err}
	}
	return l, nil
}

// serveMap serves the GPU map of p on l (nil: none).
func serveMap(ctx context.Context, l net.Listener, p *service.Service, nc *nats.Conn, log zerolog.Logger) error {
	if l == nil {
		return nil
	}
	if err := gpumap.NewServer(p, log).Serve(ctx, l, nc); err != nil {
		return err
	}
	log.Info().Str("url", "http://"+l.Addr().String()+"/").Msg("GPU map")
	return nil
}

// DefaultListen is where `planner serve` listens, and where the client
// commands look for it.
const DefaultListen = "127.0.0.1:4222"

// simNodes is a parsed `--simulate 2x8xH100[:KEY=VALUE,...]`: Nodes
// nodes of Sim, with Labels.
type simNodes struct {
	Nodes  int
	Sim    inventory.Simulation
	Labels map[string]string
}

// parseSimNodes reads "2x8xH100" (two nodes of 8 H100s) or "8xH100" (one).
func parseSimNodes(s string) (simNodes, error) {
	s, labels, hasLabels := strings.Cut(s, ":")
	var lm map[string]string
	if hasLabels {
		var err error
		if lm, err = inventory.ParseLabels(strings.Split(labels, ",")); err != nil {
			return simNodes{}, fmt.Errorf("--simulate %s:%s: labels: %w (want KEY=VALUE,KEY=VALUE after the colon)", s, labels, err)
		}
	}
	sn, err := parseSimCount(s)
	sn.Labels = lm
	return sn, err
}

// parseSimCount reads 2x8xH100 or 8xH100 (one node).
func parseSimCount(s string) (simNodes, error) {
	parts := strings.SplitN(s, "x", 3)
	if len(parts) == 3 {
		n, err := strconv.Atoi(parts[0])
		if err != nil || n < 1 || n > 10000 {
			return simNodes{}, fmt.Errorf("--simulate %q: node count must be 1 to 10000", s)
		}
		sim, err := inventory.ParseSimulation(parts[1] + "x" + parts[2])
		if err != nil {
			return simNodes{}, fmt.Errorf("--simulate %v", err)
		}
		return simNodes{Nodes: n, Sim: sim}, nil
	}
	sim, err := inventory.ParseSimulation(s)
	if err != nil {
		return simNodes{}, fmt.Errorf("--simulate %v", err)
	}
	return simNodes{Nodes: 1, Sim: sim}, nil
}

// serveOptions are planner serve's flags.
type serveOptions struct {
	server, listen, dataDir, specPath, plan, logLevel string
	stateFile                                         string
	logFormat, simMemory, metricsListen, httpListen   string
	simCPUs                                           int
	simBytes                                          uint64
	simulate                                          []string
	noLocal, secure, insecure, replaceSpec            bool
	// specSource is --spec as read, once check has read it.
	specSource                              *planner.SpecSource
	tlsCert, tlsKey                         string
	sec                                     bus.Security
	debounce, heartbeat, settle, historyAge time.Duration
	growAfter                               time.Duration
	historyBytes                            int64
	// HA: replicas of the state, the embedded server's cluster, the
	// planner lease.
	replicas            int
	clusterListen, name string
	routes              []string
	leaseTTL            time.Duration
	// probation: how long a GPU that recovered stays out.
	probation time.Duration

	// memoryLimit is --memory-limit as given; memLimit, as bytes (0: the
	// runtime's own, GOMEMLIMIT or none).
	memoryLimit string
	memLimit    uint64
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve [--server URL] [--listen HOST:PORT] [--data-dir DIR] [--spec FILE] [--plan NAME] [--simulate SPEC]... [--no-local-reporter]",
		Short: "Run the planner service: watch the inventory, publish plan versions, answer lookups",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.server, "server", "", "NATS URL to join; empty starts an embedded NATS server with JetStream")
	f.StringVar(&o.listen, "listen", DefaultListen, "HOST:PORT the embedded NATS server listens on")
	f.StringVar(&o.dataDir, "data-dir", "", "where the embedded server stores JetStream data (default $TMPDIR/poolplanner)")
	f.StringVar(&o.stateFile, "state-file", "", "where each plan's highest revision is kept, outside JetStream, so that a lost plan history never makes revision numbers repeat (default: planner-revisions.json in --data-dir with the embedded server; none with --server)")
	f.StringVar(&o.specPath, "spec", "", "job spec, YAML or JSON, or a rlightning job or cluster config (stored as the spec it stands for), stored as the plan's spec when the plan has none (a spec set since wins; see --replace-spec)")
	f.BoolVar(&o.replaceSpec, "replace-spec", false, "store --spec over the plan's stored spec when they differ")
	f.StringVar(&o.plan, "plan", "default", "the plan --spec seeds (the planner plans every spec stored)")
	f.StringArrayVar(&o.simulate, "simulate", nil, "add simulated nodes: 2x8xH100 is 2 nodes of 8 H100s, 2x8xL40S:zone=b,rack=r2 with those labels (repeatable; whole nodes: the CPUs and memory of the host such GPUs come in)")
	f.StringVar(&o.metricsListen, "metrics-listen", "", "serve Prometheus metrics at http://HOST:PORT/metrics")
	f.StringVar(&o.httpListen, "http-listen", "", "serve the live GPU map at http://HOST:PORT/")
	f.IntVar(&o.simCPUs, "cpus", 0, "CPUs of each simulated node (default: its model's host's)")
	f.StringVar(&o.simMemory, "memory", "", "memory of each simulated node, bytes or with Ki, Mi, Gi, Ti (default: its model's host's)")
	f.StringVar(&o.memoryLimit, "memory-limit", "", "soft limit on the process's memory (planner and embedded server), bytes or with Ki, Mi, Gi, Ti: the Go collector works harder near it, trading CPU for a lower peak (default: $GOMEMLIMIT, else none)")
	f.BoolVar(&o.noLocal, "no-local-reporter", false, "do not report this machine's inventory in-process")
	durationVar(f, &o.debounce, "debounce", service.DefaultDebounce, "quiet time after an inventory change before replanning")
	durationVar(f, &o.growAfter, "grow-after", service.DefaultGrowAfter, "how long a GPU must be free before an elastic group (worker_num {min, max}) grows onto it (0: at once)")
	durationVar(f, &o.settle, "settle", service.DefaultSettle, "after start, how long to wait for the nodes of the latest plan to report before replanning without them (negative: no wait)")
	durationVar(f, &o.heartbeat, "heartbeat", reporter.DefaultHeartbeat, "heartbeat of the in-process reporters")
	durationVar(f, &o.historyAge, "history-age", service.DefaultHistoryAge, "keep plan revisions this long (and the chain they need); negative: for ever")
	f.Int64Var(&o.historyBytes, "history-bytes", service.DefaultHistoryBytes, "keep at most this many bytes of plan revisions, dropping the oldest chains; negative: no limit")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error (the embedded NATS server's own notices at debug)")
	f.StringVar(&o.logFormat, "log-format", "", "json or console (default: console when stderr is a terminal, json otherwise)")
	f.BoolVar(&o.secure, "auth", false, "the embedded server requires credentials: keys kept under --data-dir/auth, admin, planner and launcher .creds written to --data-dir/creds (planner creds makes more)")
	f.BoolVar(&o.insecure, "no-auth", false, "serve a non-loopback --listen without credentials, deliberately")
	f.StringVar(&o.tlsCert, "tls-cert", "", "the embedded server's TLS certificate (PEM); with --tls-key, clients must use TLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "the key of --tls-cert (PEM)")
	f.IntVar(&o.replicas, "replicas", 1, "how many NATS servers keep each stream and bucket (1 to 5); more than the cluster has is an error")
	f.StringVar(&o.clusterListen, "cluster-listen", "", "HOST:PORT the embedded server listens on for its cluster peers (with --routes: a NATS cluster of planner serve processes)")
	f.StringSliceVar(&o.routes, "routes", nil, "the other embedded servers' cluster addresses, nats://HOST:PORT (comma-separated or repeated)")
	f.StringVar(&o.name, "server-name", "", "the embedded server's name, unique in the cluster (default: from --cluster-listen, with the hostname for a wildcard address)")
	durationVar(f, &o.probation, "probation", service.DefaultProbation, "how long a GPU that turned healthy again stays out before it gets work (0: the default; negative: not at all)")
	durationVar(f, &o.leaseTTL, "lease-ttl", service.DefaultLeaseTTL, "how long the leading planner's lease lasts unrenewed: a standby takes over within it and a second")
	addSecurity(f, &o.sec)
	return cmd
}

// check validates the flags before anything starts, and returns the
// simulated nodes and the spec's bytes.
func (o *serveOptions) check() ([]simNodes, []byte, error) {
	var sims []simNodes
	for _, s := range o.simulate {
		sn, err := parseSimNodes(s)
		if err != nil {
			return nil, nil, usageError{err}
		}
		sims = append(sims, sn)
	}
	if err := store.ValidatePlanName(o.plan); err != nil {
		return nil, nil, usagef("--plan: %v", err)
	}
	var spec []byte
	if o.specPath != "" {
		src, err := loadSpec(o.specPath)
		if err != nil {
			return nil, nil, err
		}
		spec = src.Native
		o.specSource = src
	}
	switch {
	case o.debounce < 0:
		return nil, nil, usagef("--debounce %s: must be >= 0", o.debounce)
	case o.growAfter < 0:
		return nil, nil, usagef("--grow-after %s: must be >= 0", o.growAfter)
	case o.heartbeat <= 0:
		return nil, nil, usagef("--heartbeat %s: must be positive", o.heartbeat)
	case o.historyAge == 0 || o.historyBytes == 0:
		return nil, nil, usagef("--history-age and --history-bytes: must not be 0 (negative: no limit)")
	case o.simCPUs < 0 || o.simCPUs > inventory.MaxCPUs:
		return nil, nil, usagef("--cpus %d: want 1 to %d", o.simCPUs, inventory.MaxCPUs)
	case o.replicas < 1 || o.replicas > 5:
		return nil, nil, usagef("--replicas %d: must be 1 to 5", o.replicas)
	case o.leaseTTL < time.Second || o.leaseTTL > time.Hour:
		return nil, nil, usagef("--lease-ttl %s: must be 1s to 1h", o.leaseTTL)
	}
	if err := o.checkCluster(); err != nil {
		return nil, nil, err
	}
	var err error
	if o.simBytes, err = parseBytes(o.simMemory); err != nil {
		return nil, nil, usagef("--memory %q: %v", o.simMemory, err)
	}
	if o.memLimit, err = parseBytes(o.memoryLimit); err != nil {
		return nil, nil, usagef("--memory-limit %q: %v", o.memoryLimit, err)
	}
	return sims, spec, checkServeSecurity(o.server, o.listen, o.secure, o.insecure, o.tlsCert, o.tlsKey)
}

// setMemoryLimit sets the Go runtime's soft memory limit to n bytes and
// returns the one before. Soft: past it the collector runs more often
// (CPU), it never fails an allocation.
func setMemoryLimit(n uint64) int64 {
	return debug.SetMemoryLimit(int64(min(n, math.MaxInt64)))
}

// checkCluster checks the cluster flags: they need the embedded server,
// and replicas need a cluster.
func (o *serveOptions) checkCluster() error {
	if o.server != "" && (o.clusterListen != "" || len(o.routes) > 0 || o.name != "") {
		return usagef("--cluster-listen, --routes and --server-name configure the embedded server: not with --server")
	}
	if len(o.routes) > 0 && o.clusterListen == "" {
		return usagef("--routes needs --cluster-listen: the address the other servers route to")
	}
	if o.clusterListen != "" {
		if _, _, err := net.SplitHostPort(o.clusterListen); err != nil {
			return usagef("--cluster-listen %q: want HOST:PORT", o.clusterListen)
		}
	}
	for _, r := range o.routes {
		if u, err := url.Parse(r); err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "nats-route") {
			return usagef("--routes %q: want nats://HOST:PORT", r)
		}
	}
	if o.clusterListen != "" && !o.secure && !o.insecure && !loopback(o.clusterListen) {
		return usagef("--cluster-listen %s is reachable from other hosts, and without --auth any server there could join the cluster and read or rewrite its state: add --auth (every server with the same keys), or --no-auth deliberately", o.clusterListen)
	}
	if o.server == "" && o.replicas > 1 && len(o.routes) < o.replicas-1 {
		return usagef("--replicas %d: the embedded server needs --cluster-listen and --routes naming at least %d other servers", o.replicas, o.replicas-1)
	}
	return nil
}

func (o *serveOptions) run(cmd *cobra.Command) error {
	log, err := o.logger(cmd)
	if err != nil {
		return err
	}
	sims, spec, err := o.check()
	if err != nil {
		return err
	}
	if src := o.specSource; src != nil && src.Format != planner.FormatNative {
		log.Info().Str("spec", o.specPath).Str("format", src.Format.String()).Strs("assumed", assumedFields(src)).Int("ignored", len(src.Ignored)).
			Msg("--spec read as the scheduling rlightning builds from it; planner spec convert prints the spec served")
	}
	if o.memLimit > 0 {
		// The process's for as long as it serves: not restored.
		setMemoryLimit(o.memLimit)
		log.Info().Uint64("bytes", o.memLimit).Msg("memory limit set (--memory-limit)")
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var pm *metrics.Planner
	var rm *metrics.Reporter
	var sm *metrics.Server
	// The service, once made: the unplanned-use gauge counts from it.
	var served atomic.Pointer[service.Service]
	if o.metricsListen != "" {
		reg := metrics.NewRegistry()
		pm, rm = metrics.NewPlanner(reg), metrics.NewReporter(reg)
		if o.server == "" {
			sm = metrics.NewServer(reg)
		}
		metrics.UnplannedUse(reg, func() int {
			if p := served.Load(); p != nil {
				return len(p.UnplannedUse())
			}
			return 0
		})
		metrics.PlannerHealth(reg, func() metrics.Health {
			p := served.Load()
			if p == nil {
				return metrics.Health{}
			}
			h := p.Health()
			return metrics.Health{StoodDown: h.StoodDown != "" && time.Now().Before(h.StoodDownUntil), Failures: h.Failures, Stuck: h.Stuck != "", Problems: len(h.Problems)}
		})
		if err := metrics.Serve(ctx, o.metricsListen, reg); err != nil {
			return usageError{err}
		}
	}
	mapL, err := o.listenMap()
	if err != nil {
		return err
	}
	if mapL != nil {
		defer mapL.Close()
	}
	ctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	nc, shutdown, err := o.connect(log, lost, sm)
	if err != nil {
		return err
	}
	defer shutdown()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	invs := store.NewInventoryStore(js)
	reporters, done := o.startReporters(ctx, invs, sims, log, rm)
	// The first plan waits for the bucket's contents: let the in-process
	// reporters put theirs first, so that a cold start plans on every
	// simulated node, not on the first few.
	waitReported(ctx, invs, reporters, 30*time.Second, log)
	if o.stateFile == "" && o.server == "" {
		o.stateFile = filepath.Join(o.dataDir, "planner-revisions.json")
	}
	if o.stateFile == "" {
		log.Info().Msg("no --state-file: should the plan streams be lost, revision numbers could start again at 1")
	}
	stderr := cmd.ErrOrStderr()
	seeded := func(s service.SpecSeed) { writeSeed(stderr, s, o.specPath) }
	p := service.New(service.Config{NC: nc, JS: js, Plan: o.plan, StateFile: o.stateFile, Spec: spec, ReplaceSpec: o.replaceSpec, SpecSeeded: seeded, Debounce: o.debounce, Settle: o.settle,
		HistoryAge: o.historyAge, HistoryBytes: o.historyBytes, Replicas: o.replicas, LeaseTTL: o.leaseTTL, GrowAfter: growAfter(o.growAfter), Probation: o.probation, Metrics: pm, Log: log})
	served.Store(p)
	if err := serveMap(ctx, mapL, p, nc, log); err != nil {
		return err
	}
	log.Info().Str("plan", o.plan).Int("reporters", reporters).Msg("planner serving")
	err = p.Run(ctx)
	stop()
	for range reporters {
		<-done
	}
	if cause := context.Cause(ctx); errors.Is(cause, errConnClosed) {
		// Exit non-zero, so that a supervisor starts a planner anew.
		return cause
	}
	return err
}

// writeSeed says on w, in a sentence, when --spec is not what the plan
// runs on (a stored spec kept over it), or replaced the stored one: a
// user who edits a spec file and restarts must not get the old plan
// unawares.
func writeSeed(w io.Writer, s service.SpecSeed, path string) {
	stored := fmt.Sprintf("spec revision %d, stored %s", s.Revision, s.Stored.UTC().Format(time.RFC3339))
	switch s.Kind {
	case service.SeedKept:
		fmt.Fprintf(w, "planner: plan %s keeps its stored spec (%s), which differs from --spec %s: the file is NOT in force.\n"+
			"planner: to plan on the file, run `planner spec set --plan %s %s`, or restart with --replace-spec.\n",
			s.Plan, stored, path, s.Plan, path)
	case service.SeedReplaced:
		fmt.Fprintf(w, "planner: plan %s: --spec %s replaced its stored spec (%s) (--replace-spec).\n", s.Plan, path, stored)
	}
}

// errConnClosed is why serve ends when its NATS connection closes for
// good (the server closed it and will not take it back, say).
var errConnClosed = errors.New("the NATS connection closed for good")

// connect starts the embedded server unless --server names one, and
// connects the planner; shutdown closes both. lost is told if the
// connection closes otherwise (reconnecting never gives up, so that is
// the server refusing it for good). The embedded server's dropped
// requests are counted on sm.
func (o *serveOptions) connect(log zerolog.Logger, lost context.CancelCauseFunc, sm *metrics.Server) (*nats.Conn, func(), error) {
	url, sec := o.server, o.sec
	var closing atomic.Bool
	extra := []nats.Option{nats.ClosedHandler(func(nc *nats.Conn) {
		if closing.Load() {
			return
		}
		// A refusal (credentials expired or revoked) is said as such.
		cause := nc.LastError()
		if refused := bus.Closed(nc, sec); refused != nil {
			cause = refused
		}
		err := fmt.Errorf("%w: %v", errConnClosed, cause)
		log.Error().Err(err).Msg("planner stops")
		lost(err)
	})}
	closeServer := func() {}
	watch := func(*nats.Conn) error { return nil }
	if url == "" {
		if o.dataDir == "" {
			o.dataDir = defaultDataDir()
		}
		unlock, err := bus.LockDataDir(o.dataDir)
		if err != nil {
			return nil, nil, err
		}
		eopts := bus.EmbeddedOptions{Listen: o.listen, StoreDir: o.dataDir, Log: log, TLSCert: o.tlsCert, TLSKey: o.tlsKey,
			ClusterListen: o.clusterListen, Routes: o.routes, ServerName: o.name}
		account := bus.OpenAccount
		if o.secure {
			a, planner, err := serveCreds(o.dataDir, log)
			if err != nil {
				unlock()
				return nil, nil, err
			}
			eopts.Auth, sec.Creds = a, planner
			account = a.AccountKey
		}
		if others := bus.HistoryElsewhere(o.dataDir, account); len(others) > 0 {
			log.Warn().Str("data_dir", o.dataDir).Bool("auth", o.secure).Strs("accounts_with_history", others).
				Msg("this data directory holds plan history of another account (served with --auth before and not now, or the other way round): it starts empty here; copy the streams over with nats stream backup and restore (subjects.md, Enabling auth on an existing data directory)")
		}
		ns, u, err := bus.StartEmbedded(eopts)
		if err != nil {
			unlock()
			return nil, nil, err
		}
		closeServer = func() { ns.Shutdown(); ns.WaitForShutdown(); unlock() }
		log.Info().Str("url", u).Str("data_dir", o.dataDir).Bool("auth", o.secure).Bool("tls", o.tlsCert != "").Msg("embedded NATS with JetStream started")
		// The planner itself talks to its server in process: no socket.
		// In process the server offers TLS without requiring it; a tls://
		// URL would ask for it over the pipe.
		url = strings.Replace(u, "tls://", "nats://", 1)
		extra = append(extra, nats.InProcessServer(ns))
		if sm != nil {
			watch = func(nc *nats.Conn) error {
				_, err := bus.WatchDropped(ns, account, nc, sm.Dropped)
				return err
			}
		}
	}
	nc, err := bus.Connect(url, "poolplanner-planner", log, sec, extra...)
	if err != nil {
		closeServer()
		return nil, nil, err
	}
	if err := watch(nc); err != nil {
		nc.Close()
		closeServer()
		return nil, nil, err
	}
	return nc, func() { closing.Store(true); nc.Close(); closeServer() }, nil
}

// startReporters runs the in-process reporters (this machine's unless
// --no-local-reporter, and the simulated nodes); each sends on done when
// it ends.
func (o *serveOptions) startReporters(ctx context.Context, store *store.InventoryStore, sims []simNodes, log zerolog.Logger, m *metrics.Reporter) (int, <-chan struct{}) {
	done := make(chan struct{})
	reporters := 0
	// One server takes every reporter's requests: in turn, not all at once.
	paced := newPacedStore(ctx, store, reporterRequests)
	start := func(src inventory.Source, id string) {
		reporters++
		go func() {
			defer func() { done <- struct{}{} }()
			err := reporter.Run(ctx, reporter.Config{Source: src, Store: paced, Heartbeat: o.heartbeat,
				TTL: o.heartbeat * reporter.DefaultTTLBeats, Log: log.With().Str("node", id).Logger(), Metrics: m})
			if err != nil {
				log.Error().Err(err).Str("node", id).Msg("reporter stopped")
			}
		}()
	}
	if !o.noLocal {
		facts, err := inventory.LocalFacts(inventory.FactsOptions{})
		if err != nil {
			log.Warn().Err(err).Msg("no local reporter: cannot read this machine's facts")
		} else {
			// Without NVML libraries this node reports no GPUs, which is
			// what it has for planning.
			start(localSource(ctx, facts, log), facts.NodeID)
		}
	}
	for si, sn := range sims {
		for i := range sn.Nodes {
			id := fmt.Sprintf("sim-%s-%d", strings.ToLower(sn.Sim.Model.Key), i+1)
			if si > 0 {
				id = fmt.Sprintf("sim%d-%s-%d", si+1, strings.ToLower(sn.Sim.Model.Key), i+1)
			}
			facts := withHost(sn.Sim.Host(inventory.Facts{NodeID: id, Hostname: id, IP: fmt.Sprintf("10.%d.%d.%d", si, (i+1)/256, (i+1)%256)}), o.simCPUs, o.simBytes)
			facts.Labels = maps.Clone(sn.Labels)
			if per := sn.Sim.Model.DomainNodes; per > 0 && facts.Labels[inventory.CliqueLabel] == "" {
				// Rack-scale parts: DomainNodes nodes to an NVLink domain.
				if facts.Labels == nil {
					facts.Labels = map[string]string{}
				}
				facts.Labels[inventory.CliqueLabel] = fmt.Sprintf("sim%d-%s-domain-%d", si+1, strings.ToLower(sn.Sim.Model.Key), i/per+1)
			}
			start(inventory.NewSimulated(facts, sn.Sim), id)
		}
	}
	return reporters, done
}

// checkServeSecurity refuses flag combinations that would not do what
// they say, and an open embedded server on a non-loopback address
// unless --no-auth asks for it.
func checkServeSecurity(server, listen string, secure, insecure bool, tlsCert, tlsKey string) error {
	switch {
	case secure && insecure:
		return usagef("--auth and --no-auth: choose one")
	case server != "" && (secure || tlsCert != "" || tlsKey != ""):
		return usagef("--auth, --tls-cert and --tls-key secure the embedded server; with --server, pass the planner's --creds (and --tls-ca)")
	case (tlsCert == "") != (tlsKey == ""):
		return usagef("--tls-cert and --tls-key go together")
	case server == "" && !secure && !insecure && !loopback(listen):
		return usagef("--listen %s is reachable from other hosts, and without --auth anyone there could rewrite the plan: add --auth, or --no-auth to serve it open deliberately", listen)
	}
	return nil
}

// loopback says whether HOST:PORT listens on this host only.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveCreds opens the authority under dataDir (keys made the first
// time) and writes the admin, planner and launcher credentials there if
// missing; it returns the planner's file, which serve connects with.
func serveCreds(dataDir string, log zerolog.Logger) (*auth.Authority, string, error) {
	a, err := auth.Open(dataDir)
	if err != nil {
		return nil, "", err
	}
	paths, err := writeCreds(a, filepath.Join(dataDir, "creds"), []auth.Role{auth.Admin, auth.Planner, auth.Launcher}, nil)
	if err != nil {
		return nil, "", err
	}
	log.Info().Str("admin", paths[0]).Str("planner", paths[1]).Str("launcher", paths[2]).Msg("credentials")
	return a, paths[1], nil
}

// localSource reports this machine's GPUs with NVML where it can, else
// none, as the reporter binary does; the health watch runs until ctx ends.
func localSource(ctx context.Context, facts inventory.Facts, log zerolog.Logger) inventory.Source {
	src, stop := inventory.OpenLocal(ctx, inventory.NVMLOptions{Facts: facts, Log: log}, true)
	go func() { <-ctx.Done(); stop() }()
	return src
}

// waitReported waits until the inventory bucket holds n keys (the
// in-process reporters' first puts), at most timeout.
func waitReported(ctx context.Context, store *store.InventoryStore, n int, timeout time.Duration, log zerolog.Logger) {
	if n == 0 {
		return
	}
	deadline := time.Now().Add(timeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if kv, err := store.KV(ctx); err == nil {
			if st, err := kv.Status(ctx); err == nil && st.Values() >= uint64(n) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Warn().Int("reporters", n).Msg("not every in-process reporter has reported yet; planning anyway")
}

// growAfter is --grow-after as the service's Config takes it: 0 there
// is the default, so "at once" is negative.
func growAfter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
