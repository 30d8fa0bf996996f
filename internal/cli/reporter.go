package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/reporter"
	"github.com/poolplanner/poolplanner/internal/store"
)

// reporterOptions are the command's flags, as the contract names them.
type reporterOptions struct {
	server    string
	sec       bus.Security
	nodeID    string
	ip        string
	heartbeat time.Duration
	ttl       time.Duration
	simulate  string
	busy      []int
	labels    []string
	once      bool
	logLevel  string
	logFormat string
	xidIgnore []string
	// xids are simulated XIDs (--xid GPU:CODE[@DELAY]); healthEvery,
	// how often GPUs unhealthy for an XID a reset resolves are checked.
	xids        []string
	healthEvery time.Duration
	cpus        int
	memory      string
	metrics     string
}

// reporterConfig is reporterOptions validated and parsed.
type reporterConfig struct {
	reporterOptions
	sim     *inventory.Simulation
	memory  uint64
	labelM  map[string]string
	ignored []uint64
	level   zerolog.Level
	xidsAt  []inventory.XIDInjection
}

// ReporterMain runs the reporter command with args and returns the exit
// code; cmd/reporter is a one-line main around it. ctx is cancelled on
// SIGTERM or SIGINT.
func ReporterMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var opts reporterOptions
	cmd := &cobra.Command{
		Use:   "reporter",
		Short: "Keep this node's GPU inventory in the poolplanner inventory bucket",
		Long: `reporter publishes this node's inventory (GPUs from NVML, or simulated with
--simulate) into the NATS KV bucket ` + client.InventoryBucket + `, again every --heartbeat
and at once when it changes. The key vanishes --ttl after the reporter stops
without a word; on SIGTERM or SIGINT the reporter deletes it first (only if
its own write is the last). A reporter that finds the node's key held by
another reporter that still runs (on another host, or a live pid on this
one) exits 1, naming that reporter's host and pid; one whose predecessor on
this host is gone takes the key over at once.`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := opts.validate(cmd.Flags().Changed("log-format"), stderr)
			if err != nil {
				return err
			}
			return runReporter(cmd.Context(), cfg, stdout, stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.server, "server", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	addSecurity(f, &opts.sec)
	f.StringVar(&opts.nodeID, "node-id", "", "node id, the key in the bucket (default the hostname)")
	f.StringVar(&opts.ip, "ip", "", "IP other nodes reach this one on (default the address of the default route's interface)")
	durationVar(f, &opts.heartbeat, "heartbeat", reporter.DefaultHeartbeat, "how often to refresh the key")
	durationVar(f, &opts.ttl, "ttl", 0, "how long the key outlives a reporter that died (default 3 heartbeats)")
	f.StringVar(&opts.simulate, "simulate", "", "report simulated GPUs instead of NVML's: NxMODEL, e.g. 8xH100 (a whole node: the CPUs and memory of the host such GPUs come in)")
	f.IntSliceVar(&opts.busy, "busy", nil, "with --simulate: these GPU indices run a (simulated) process, e.g. 0,3")
	f.StringVar(&opts.metrics, "metrics-listen", "", "serve Prometheus metrics at http://HOST:PORT/metrics")
	f.IntVar(&opts.cpus, "cpus", 0, "report this many CPUs (default: the machine's, or the simulated host's)")
	f.StringVar(&opts.memory, "memory", "", "report this much memory, bytes or with Ki, Mi, Gi, Ti (default: the machine's, or the simulated host's)")
	f.StringArrayVar(&opts.labels, "label", nil, "a node label KEY=VALUE (repeatable)")
	f.BoolVar(&opts.once, "once", false, "print the inventory as JSON and exit, without NATS")
	f.StringVar(&opts.logLevel, "log-level", "info", "trace, debug, info, warn or error")
	f.StringVar(&opts.logFormat, "log-format", "", "json or console (default: console when stderr is a terminal, json otherwise)")
	f.StringArrayVar(&opts.xids, "xid", nil, "with --simulate: GPU:CODE[@DELAY] makes GPU throw XID CODE DELAY after start (repeatable), classed as NVML's are: 3:94@30s")
	durationVar(f, &opts.healthEvery, "health-every", inventory.DefaultHealthEvery, "how often a GPU unhealthy for an XID that a reset resolves is checked again (healthy once NVML reports it clean)")
	f.StringSliceVar(&opts.xidIgnore, "xid-ignore", uintStrings(inventory.DefaultIgnoredXIDs), "XID errors that do not make a GPU unhealthy")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)

	err := cmd.ExecuteContext(ctx)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, new(usageError)) || strings.HasPrefix(err.Error(), "unknown command"):
		fmt.Fprintf(stderr, "reporter: %v\n", err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "reporter: %v\n", err)
		return ExitInvalid
	}
}

func (o reporterOptions) validate(formatSet bool, stderr io.Writer) (reporterConfig, error) {
	c := reporterConfig{reporterOptions: o}
	if o.nodeID != "" {
		if err := inventory.ValidateNodeID(o.nodeID); err != nil {
			return c, usagef("--node-id: %w", err)
		}
	}
	if o.ip != "" && net.ParseIP(o.ip) == nil {
		return c, usagef("--ip %q: not an IP address", o.ip)
	}
	if o.heartbeat <= 0 {
		return c, usagef("--heartbeat %s: must be positive", o.heartbeat)
	}
	if c.ttl == 0 {
		c.ttl = reporter.DefaultTTLBeats * o.heartbeat
	}
	if c.ttl < time.Second {
		return c, usagef("--ttl %s: must be at least 1s (NATS counts message TTLs in whole seconds)", c.ttl)
	}
	if c.ttl <= o.heartbeat {
		return c, usagef("--ttl %s: must be longer than --heartbeat %s", c.ttl, o.heartbeat)
	}
	if o.simulate != "" {
		sim, err := inventory.ParseSimulation(o.simulate)
		if err != nil {
			return c, usagef("--simulate %w", err)
		}
		c.sim = &sim
		for _, i := range o.busy {
			if i < 0 || i >= sim.Count {
				return c, usagef("--busy %d: the simulated node has GPUs 0 to %d", i, sim.Count-1)
			}
		}
		for _, x := range o.xids {
			inj, err := inventory.ParseXIDInjection(x, sim.Count)
			if err != nil {
				return c, usageError{err}
			}
			c.xidsAt = append(c.xidsAt, inj)
		}
	} else if len(o.busy) > 0 {
		return c, usagef("--busy marks simulated GPUs: give --simulate too")
	} else if len(o.xids) > 0 {
		return c, usagef("--xid injects XIDs into simulated GPUs: give --simulate too")
	}
	if o.healthEvery <= 0 {
		return c, usagef("--health-every %s: must be positive", o.healthEvery)
	}
	labels, err := inventory.ParseLabels(o.labels)
	if err != nil {
		return c, usagef("--label %w", err)
	}
	c.labelM = labels
	c.ignored = []uint64{}
	for _, s := range o.xidIgnore {
		x, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return c, usagef("--xid-ignore %q: not an XID number", s)
		}
		c.ignored = append(c.ignored, x)
	}
	if o.cpus < 0 || o.cpus > inventory.MaxCPUs {
		return c, usagef("--cpus %d: want 1 to %d", o.cpus, inventory.MaxCPUs)
	}
	if c.memory, err = parseBytes(o.memory); err != nil {
		return c, usagef("--memory %q: %v", o.memory, err)
	}
	if c.level, err = zerolog.ParseLevel(o.logLevel); err != nil || o.logLevel == "" {
		return c, usagef("--log-level %q: want trace, debug, info, warn or error", o.logLevel)
	}
	c.logFormat, err = logFormat(c.logFormat, formatSet, stderr)
	return c, err
}

func isTerminal(w io.Writer) bool {
	// A terminal, not any character device: /dev/null is one too.
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

func newReporterLogger(c reporterConfig, stderr io.Writer) zerolog.Logger {
	return newLogger(c.logFormat, c.level, stderr)
}

// newLogger is the reporter's and serve's logger: JSON, or for people
// (console) with times of day.
func newLogger(format string, level zerolog.Level, stderr io.Writer) zerolog.Logger {
	var w io.Writer = stderr
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// logFormat is --log-format as given, or console where stderr is a
// terminal and the flag was not set.
func logFormat(format string, set bool, stderr io.Writer) (string, error) {
	switch {
	case set:
	case isTerminal(stderr):
		format = "console"
	default:
		format = "json"
	}
	if format != "json" && format != "console" {
		return "", usagef("--log-format %q: want json or console", format)
	}
	return format, nil
}

func runReporter(ctx context.Context, c reporterConfig, stdout, stderr io.Writer) error {
	log := newReporterLogger(c, stderr)
	facts, err := inventory.LocalFacts(inventory.FactsOptions{NodeID: c.nodeID, IP: c.ip, Labels: c.labelM})
	if errors.Is(err, inventory.ErrNoDefaultRoute) || err != nil && facts.NodeID != "" {
		log.Warn().Err(err).Str("ip", facts.IP).Msg("cannot tell the IP other nodes reach this one on; pass --ip")
	} else if err != nil {
		return fmt.Errorf("node facts: %w", err)
	}
	if err := inventory.ValidateNodeID(facts.NodeID); err != nil {
		return usagef("hostname is not a usable node id (%w); pass --node-id", err)
	}
	if c.sim != nil {
		facts = c.sim.Host(facts)
	}
	facts = withHost(facts, c.cpus, c.memory)
	log = log.With().Str("node_id", facts.NodeID).Logger()

	src, closeSrc := reporterSource(ctx, c, facts, log)
	defer closeSrc()

	if c.once {
		inv, err := src.Inventory(ctx)
		if err != nil {
			return fmt.Errorf("inventory: %w", err)
		}
		inv.ReportedAt = time.Now().UTC()
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(inv)
	}

	// Credentials made for one node's reporter may write that node's key
	// only: say so now, not after the server refuses every put.
	id, err := c.sec.Identity()
	if err != nil {
		return usageError{err}
	}
	if id.Role != "" && id.Role != auth.Reporter && id.Role != auth.Planner {
		return usagef("--creds %s: credentials of role %s cannot report; `planner creds reporter --node-id %s` makes a reporter's", c.sec.Creds, id.Role, facts.NodeID)
	}
	if id.Role == auth.Reporter && id.Node != facts.NodeID {
		return usagef("authorization violation: --creds %s may only write key %s; this reporter's node id is %s", c.sec.Creds, id.Node, facts.NodeID)
	}
	// Credentials that expire (or are withdrawn) while it runs close the
	// connection for good: the reporter ends with why, not in silence.
	ctx, refused := context.WithCancelCause(ctx)
	defer refused(nil)
	nc, err := bus.Connect(c.server, "poolplanner-reporter "+facts.NodeID, log, c.sec, nats.ClosedHandler(func(nc *nats.Conn) {
		if err := bus.Closed(nc, c.sec); err != nil {
			refused(err)
		}
	}))
	if err != nil {
		if bus.Refusal(err) {
			return err
		}
		return usagef("--server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	log.Info().Str("server", c.server).Str("heartbeat", c.heartbeat.String()).Str("ttl", c.ttl.String()).Msg("reporter starting")
	invs := store.NewInventoryStore(js)
	// A reporter's credentials cannot create the bucket: it waits for the
	// planner to.
	invs.NoCreate = id.Role == auth.Reporter
	var m *metrics.Reporter
	if c.metrics != "" {
		reg := metrics.NewRegistry()
		m = metrics.NewReporter(reg)
		if err := metrics.Serve(ctx, c.metrics, reg); err != nil {
			return usageError{err}
		}
	}
	err = reporter.Run(ctx, reporter.Config{
		Metrics:   m,
		Source:    src,
		Store:     invs,
		Heartbeat: c.heartbeat,
		TTL:       c.ttl,
		Log:       log,
	})
	if cause := context.Cause(ctx); ctx.Err() != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return fmt.Errorf("the server closed the connection: %w", cause)
	}
	return err
}

// reporterSource picks where GPUs come from: the simulation if asked, else NVML,
// else none. Without NVML the node is still reported, with no GPUs.
func reporterSource(ctx context.Context, c reporterConfig, facts inventory.Facts, log zerolog.Logger) (inventory.Source, func()) {
	if c.sim != nil {
		log.Info().Str("simulate", c.sim.String()).Ints("busy", c.busy).Msg("reporting simulated GPUs")
		src := inventory.NewSimulated(facts, *c.sim)
		_ = src.SetBusy(c.busy) // checked with the flags
		if c.once || len(c.xidsAt) == 0 {
			return src, func() {}
		}
		xctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); src.RunXIDs(xctx, c.xidsAt, c.healthEvery) }()
		return src, func() { cancel(); <-done }
	}
	return inventory.OpenLocal(ctx, inventory.NVMLOptions{Facts: facts, IgnoredXIDs: c.ignored, HealthEvery: c.healthEvery, Log: log}, !c.once)
}

func uintStrings(xs []uint64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.FormatUint(x, 10)
	}
	return out
}

// withHost overrides facts' CPUs and memory where cpus and memory are
// set (not 0).
func withHost(f inventory.Facts, cpus int, memory uint64) inventory.Facts {
	if cpus > 0 {
		f.CPUs = cpus
	}
	if memory > 0 {
		f.MemoryBytes = memory
	}
	return f
}

// parseBytes reads a size: bytes, or a number with Ki, Mi, Gi or Ti
// (binary units; K, M, G, T mean the same); "" is 0.
func parseBytes(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := uint64(1)
	for i, u := range []string{"Ti", "T", "Gi", "G", "Mi", "M", "Ki", "K"} {
		if rest, ok := strings.CutSuffix(s, u); ok {
			s, mult = rest, 1<<(10*(4-i/2))
			break
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(n) || strings.ContainsAny(s, "_xXpP") || n*float64(mult) < 1 || n*float64(mult) > 1<<60 {
		return 0, errors.New("want a size such as 2Ti, 512Gi or a number of bytes")
	}
	return uint64(n * float64(mult)), nil
}
