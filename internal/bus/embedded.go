package bus

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/auth"
)

// EmbeddedOptions configure an in-process NATS server.
type EmbeddedOptions struct {
	// Listen is HOST:PORT; port 0 picks a free one. Empty means
	// 127.0.0.1:0.
	Listen string
	// StoreDir is where JetStream keeps its data. Required: an embedded
	// server without persistence would lose the inventory on restart.
	StoreDir string
	// Log receives the server's log lines; the zero logger drops them.
	Log zerolog.Logger
	// ReadyTimeout bounds the wait for the server to accept clients;
	// zero means 10s.
	ReadyTimeout time.Duration
	// MaxPayload is the largest message the server takes; zero means
	// NATS's default, 1 MB, which poolplanner never needs raised. (Tests
	// lower it to see large bodies go into objects.)
	MaxPayload int32
	// Auth, when set, makes the server require credentials it signed
	// (operator mode): anonymous clients are refused and each role gets
	// its permissions.
	Auth *auth.Authority
	// TLSCert and TLSKey, when set, make clients connect with TLS.
	TLSCert, TLSKey string
	// ClusterListen, when set (HOST:PORT), makes the server one of a NATS
	// cluster, JetStream replicated by Raft; Routes are the other
	// servers' cluster addresses (nats://HOST:PORT), and ServerName, which
	// must differ from theirs, names this one (default: from
	// ClusterListen). With Auth, routes authenticate with a secret all
	// servers with the same keys share.
	ClusterListen string
	Routes        []string
	ServerName    string
	// MaxFileStore bounds JetStream's file storage (bytes); zero means
	// NATS's default (most of the disk).
	MaxFileStore int64
	// RequestQueueLimit bounds the JetStream API requests the server
	// queues before it drops them all; zero means NATS's default
	// (10,000). (Tests lower it to see drops counted.)
	RequestQueueLimit int64
}

// ClusterName names the NATS cluster of planner serve's servers.
const ClusterName = "poolplanner"

// StartEmbedded starts a NATS server with JetStream in this process and
// returns it with the URL clients connect to. The caller owns shutdown:
// ns.Shutdown(); ns.WaitForShutdown().
func StartEmbedded(opts EmbeddedOptions) (*server.Server, string, error) {
	if opts.StoreDir == "" {
		return nil, "", errors.New("embedded nats: no store dir")
	}
	listen := opts.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, "", fmt.Errorf("embedded nats: listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, "", fmt.Errorf("embedded nats: listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	sopts := &server.Options{
		ServerName: "poolplanner",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
		// The caller owns signals (the reporter and planner both handle
		// SIGTERM themselves).
		NoSigs:            true,
		MaxPayload:        opts.MaxPayload,
		JetStreamMaxStore: opts.MaxFileStore,
		// Info requests (stream and consumer info, direct gets) queue
		// apart, to the same limit.
		JetStreamRequestQueueLimit: opts.RequestQueueLimit,
	}
	if err := secure(sopts, opts); err != nil {
		return nil, "", err
	}
	if err := cluster(sopts, opts); err != nil {
		return nil, "", err
	}
	// A taken port fails now, by name, rather than after ReadyTimeout as
	// "not ready" (the server only logs its failed listen).
	if err := errors.Join(portFree(listen, port), portFree(opts.ClusterListen, sopts.Cluster.Port)); err != nil {
		return nil, "", err
	}
	ns, err := server.NewServer(sopts)
	if err != nil {
		return nil, "", fmt.Errorf("embedded nats: %w", err)
	}
	ns.SetLoggerV2(serverLogger{opts.Log}, false, false, false)
	go ns.Start()
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	if !ns.ReadyForConnections(timeout) {
		ns.Shutdown()
		return nil, "", fmt.Errorf("embedded nats: not ready on %s after %s", listen, timeout)
	}
	return ns, ns.ClientURL(), nil
}

// portFree checks that addr (HOST:PORT, port its port) can be listened
// on; port 0 (any) always can.
func portFree(addr string, port int) error {
	if addr == "" || port <= 0 {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("embedded nats: listen %s: %w (another server there? choose another port)", addr, err)
	}
	return l.Close()
}

// cluster sets the server's cluster: its listen address, routes, name.
func cluster(sopts *server.Options, opts EmbeddedOptions) error {
	if opts.ServerName != "" {
		sopts.ServerName = opts.ServerName
	}
	if opts.ClusterListen == "" {
		if len(opts.Routes) > 0 {
			return errors.New("embedded nats: routes need a cluster listen address")
		}
		return nil
	}
	host, portStr, err := net.SplitHostPort(opts.ClusterListen)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("embedded nats: cluster listen %q: want HOST:PORT", opts.ClusterListen)
	}
	// A peer that is down is tried again with backoff, and said once
	// in 30 attempts, not on each (four error lines a second): the peer
	// dials us itself when it is back.
	sopts.Cluster = server.ClusterOpts{Name: ClusterName, Host: host, Port: port, ConnectBackoff: true}
	sopts.ReconnectErrorReports = 30
	if opts.ServerName == "" {
		// Named after where it listens; a wildcard address is the same on
		// every host, so there the host's name goes in.
		where := opts.ClusterListen
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			h, _ := os.Hostname()
			where = h + ":" + portStr
		}
		sopts.ServerName = "poolplanner-" + strings.NewReplacer(":", "-", ".", "-", "[", "", "]", "").Replace(where)
	}
	if opts.Auth != nil {
		sopts.Cluster.Username, sopts.Cluster.Password = "poolplanner", opts.Auth.RouteSecret()
	}
	var routes []*url.URL
	for _, r := range opts.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return fmt.Errorf("embedded nats: route %q: want nats://HOST:PORT", r)
		}
		if opts.Auth != nil {
			u.User = url.UserPassword(sopts.Cluster.Username, sopts.Cluster.Password)
		}
		routes = append(routes, u)
	}
	sopts.Routes = routes
	return nil
}

// secure sets the server's auth (the authority's operator and accounts,
// JetStream in poolplanner's account) and TLS.
func secure(sopts *server.Options, opts EmbeddedOptions) error {
	if a := opts.Auth; a != nil {
		resolver := &server.MemAccResolver{}
		if err := resolver.Store(a.AccountKey, a.AccountJWT); err != nil {
			return fmt.Errorf("embedded nats: account: %w", err)
		}
		if err := resolver.Store(a.ClientsKey, a.ClientsJWT); err != nil {
			return fmt.Errorf("embedded nats: clients account: %w", err)
		}
		if err := resolver.Store(a.SystemKey, a.SystemJWT); err != nil {
			return fmt.Errorf("embedded nats: system account: %w", err)
		}
		sopts.TrustedOperators = []*jwt.OperatorClaims{a.Operator()}
		sopts.AccountResolver = resolver
		sopts.SystemAccount = a.SystemKey
	}
	if (opts.TLSCert == "") != (opts.TLSKey == "") {
		return errors.New("embedded nats: TLS needs both a certificate and its key")
	}
	if opts.TLSCert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: opts.TLSCert, KeyFile: opts.TLSKey})
		if err != nil {
			return fmt.Errorf("embedded nats: TLS: %w", err)
		}
		sopts.TLSConfig = tc
		sopts.TLS = true
		sopts.TLSTimeout = 5
	}
	return nil
}

// serverLogger routes nats-server's log lines to zerolog.
type serverLogger struct{ log zerolog.Logger }

// Noticef: the server's notices (its banner, routes coming and going)
// are for debugging poolplanner, not for its operator's eyes.
func (l serverLogger) Noticef(format string, v ...any) {
	l.log.Debug().Str("component", "nats-server").Msgf(format, v...)
}
func (l serverLogger) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.WithLevel(serverLevel(msg, zerolog.WarnLevel)).Str("component", "nats-server").Msg(msg)
}
func (l serverLogger) Fatalf(format string, v ...any) {
	l.log.Error().Str("component", "nats-server").Msgf(format, v...)
}
func (l serverLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.WithLevel(serverLevel(msg, zerolog.ErrorLevel)).Str("component", "nats-server").Msg(msg)
}
func (l serverLogger) Debugf(format string, v ...any) {
	l.log.Debug().Str("component", "nats-server").Msgf(format, v...)
}
func (l serverLogger) Tracef(format string, v ...any) {
	l.log.Trace().Str("component", "nats-server").Msgf(format, v...)
}

// serverLevel is the level a nats-server warning or error (msg, as the
// server words it; a rate-limited one comes as "%s" and its text, so the
// words are read, not the format) is logged at: def, the server's own,
// but info for a line normal operation produces (expectedServerLine),
// so that a warning is worth an operator's look.
func serverLevel(msg string, def zerolog.Level) zerolog.Level {
	if expectedServerLine(msg) {
		return zerolog.InfoLevel
	}
	return def
}

// expectedServerLine reports whether a nats-server line says what the
// server does about a state it always passes through and mends by
// itself, nothing lost:
//   - a cluster forming, or a peer away (status shows it OFFLINE):
//     routes that do not connect yet (the server retries them for
//     ever), JetStream waiting for the routes and a meta leader, a
//     replica catching up, a stream moved to more servers (--replicas
//     raised in place);
//   - a route whose peer closed its end (servers that dial each other
//     at once keep one of the two routes and close the other; a peer
//     stopped): the write on it fails, and the server dials again;
//   - a restart after an unclean stop (kill -9, power loss): a stream's
//     index older than its message blocks, which the server rebuilds
//     from the blocks.
//
// Damage stays a warning: a checksum that does not match, a corrupt or
// missing block, an inconsistency.
func expectedServerLine(msg string) bool {
	// By how the lines begin (nats-server v2.15).
	if rest, ok := strings.CutPrefix(msg, "Filestore ["); ok {
		_, what, ok := strings.Cut(rest, "] ")
		return ok && hasAnyPrefix(what,
			"Recovering stream state from index errored",
			"Recovering TTL state from index errored",
			"Recovering message scheduling state from index errored",
			"Recovering sources state from index errored",
			"Stream state outdated",
			"TTL state is outdated",
			"Message scheduling state is outdated",
			"Sourcing state is outdated")
	}
	if _, rest, ok := strings.Cut(msg, " - rid:"); ok {
		// "HOST:PORT - rid:N - Error flushing: writev ...: connection
		// reset by peer": a route's connection, closed at the other end.
		_, what, _ := strings.Cut(rest, " - ")
		return strings.HasPrefix(what, "Error flushing") &&
			(strings.HasSuffix(what, "connection reset by peer") || strings.HasSuffix(what, "broken pipe"))
	}
	return hasAnyPrefix(msg,
		"Error trying to connect to route",
		"Waiting for routing to be established",
		"JetStream has not established contact with a meta leader",
		"JetStream is not current with the meta leader",
		"JetStream cluster detected stream remapping",
		"Catchup for stream ",
		"Metalayer blocking snapshot")
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
