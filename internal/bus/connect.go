package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/auth"
)

// Backoff bounds.
const (
	BackoffMin = 100 * time.Millisecond
	BackoffMax = 5 * time.Second
)

// StartGrace is how long after a planner or reporter starts JetStream
// not answering is expected, and logged at info rather than warned
// about: servers started one after another by hand form a cluster, elect
// a meta leader and then each stream's leader in about as long. Past it,
// the same failures are warnings.
const StartGrace = time.Minute

// StartLevel is the level of a failure to reach JetStream elapsed after
// start, before the first success: info within StartGrace, then warn.
func StartLevel(elapsed time.Duration) zerolog.Level {
	if elapsed < StartGrace {
		return zerolog.InfoLevel
	}
	return zerolog.WarnLevel
}

// Backoff is the wait before retry number attempt (0-based): doubling from
// BackoffMin to BackoffMax, with ±20% jitter so that a thousand reporters
// cut off together do not come back together.
func Backoff(attempt int) time.Duration {
	d := BackoffMax
	attempt = max(attempt, 0)
	if attempt < 16 {
		d = min(BackoffMin<<attempt, BackoffMax)
	}
	jitter := time.Duration(rand.Int64N(int64(d)/5*2+1)) - d/5
	return d + jitter
}

// Connect dials url for a long-lived client named name, with sec's
// credentials and CA. A server that is down at start is not an error:
// the connection keeps retrying, forever, with Backoff, and JetStream
// calls fail until it is up. Connection events are logged to log,
// refusals (credentials, permissions) reworded by Explain. extra options
// come last and win.
func Connect(url, name string, log zerolog.Logger, sec Security, extra ...nats.Option) (*nats.Conn, error) {
	secOpts, err := sec.Options()
	if err != nil {
		return nil, err
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			return Backoff(attempts - 1)
		}),
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", nc.ConnectedUrlRedacted()).Msg("connected to NATS")
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed on purpose: no outage to report
			}
			ev := log.Warn()
			if err != nil {
				ev = ev.Err(Explain(err, nil, sec))
			}
			ev.Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Debug().Msg("NATS connection closed")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				err = fmt.Errorf("%s may not do this: %w", sec.who(), err)
			}
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS async error")
		}),
	}
	if err := sec.Expired(time.Now()); err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	opts = append(opts, secOpts...)
	opts = append(opts, extra...)
	// A first try that cannot retry: a refusal (credentials, TLS) is
	// the caller's error, for retrying cannot fix it; only a server
	// not reachable is waited for.
	nc, err := nats.Connect(url, append(opts, nats.RetryOnFailedConnect(false))...)
	if err == nil {
		return nc, nil
	}
	if Refusal(err) {
		return nil, fmt.Errorf("connect %s: %w", url, Explain(err, nil, sec))
	}
	if nc, err = nats.Connect(url, opts...); err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, Explain(err, nil, sec))
	}
	if !nc.IsConnected() {
		log.Warn().Str("server", url).Msg("NATS not reachable yet; retrying in the background")
	}
	return nc, nil
}

// Refusal says whether err is the server refusing the client, or the
// client the server, for a reason retrying cannot fix: credentials
// refused, expired or revoked, a certificate that cannot be verified,
// TLS wanted by one side only.
func Refusal(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrAuthorization) || authExpired(err) || authRevoked(err) ||
		errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) {
		return true
	}
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// authExpired and authRevoked read the server's refusals of expired or
// revoked credentials: nats.go's sentinels, or the server's -ERR as it
// came during the connect (its text is not the sentinels').
func authExpired(err error) bool {
	return errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authentication expired")
}

func authRevoked(err error) bool {
	return errors.Is(err, nats.ErrAuthRevoked) || strings.Contains(strings.ToLower(err.Error()), "authentication revoked")
}

// Closed is why nc closed when a refusal closed it (nats.go gives up
// on credentials refused twice in a row, as when they expire), reworded
// by Explain; nil when it closed for another reason (Close).
func Closed(nc *nats.Conn, sec Security) error {
	if err := nc.LastError(); err != nil && Refusal(err) {
		return Explain(err, nil, sec)
	}
	return nil
}

// StopOnDone calls stop when ctx is done or when the returned channel is
// closed, whichever comes first: a reader closes it when its iterator
// ended on its own (a closed consumer), so no goroutine outlives it.
func StopOnDone(ctx context.Context, stop func()) chan<- struct{} {
	ended := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-ended:
		}
		stop()
	}()
	return ended
}

// Security is how a client proves who it is to the server, and how it
// checks the server: the flags --creds and --tls-ca.
type Security struct {
	// Creds is a .creds file (`planner creds ROLE`); empty: connect
	// without credentials.
	Creds string
	// TLSCA is a PEM file of the CA that signed the server's certificate;
	// empty: the system's CAs (TLS is still used when the server asks
	// for it, or the URL is tls://).
	TLSCA string
}

// Options are the nats options for s, after checking that its files can
// be read, with the flag named in the error.
func (s Security) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if s.Creds != "" {
		id, err := s.Identity()
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(s.Creds))
		if id.Inbox != "" {
			opts = append(opts, nats.CustomInboxPrefix(id.Inbox))
		}
	}
	if s.TLSCA != "" {
		if _, err := os.Stat(s.TLSCA); err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		opts = append(opts, nats.RootCAs(s.TLSCA))
	}
	return opts, nil
}

// Expired refuses credentials whose expiry has passed by now, before
// they are offered to a server. A NATS server accepts a JWT until the
// second after its expiry and then closes the connection at once, so a
// command dialling in that second could answer, or not, by chance;
// saying so here makes the refusal the same whenever it comes.
func (s Security) Expired(now time.Time) error {
	id, err := s.Identity()
	if err != nil || s.Creds == "" || id.Expires.IsZero() || now.Before(id.Expires) {
		return nil // unreadable credentials are Options' error
	}
	again := string(id.Role)
	if id.Node != "" {
		again += " --node-id " + id.Node
	}
	return fmt.Errorf("credentials expired: %s expired at %s; `planner creds %s` makes new ones",
		s.who(), id.Expires.UTC().Format(time.RFC3339), again)
}

// Identity is the role the credentials were made for (zero without
// credentials, or with ones poolplanner did not make).
func (s Security) Identity() (auth.Identity, error) {
	if s.Creds == "" {
		return auth.Identity{}, nil
	}
	data, err := os.ReadFile(s.Creds)
	if err != nil {
		return auth.Identity{}, fmt.Errorf("--creds: %w", err)
	}
	id, err := auth.IdentityOf(data)
	if err != nil {
		return auth.Identity{}, fmt.Errorf("--creds %s: %w", s.Creds, err)
	}
	return id, nil
}

// who says whose credentials s holds, for messages.
func (s Security) who() string {
	id, _ := s.Identity()
	switch {
	case s.Creds == "":
		return "a client without credentials"
	case id.Role == "":
		return "the credentials in " + s.Creds
	case id.Node != "":
		return fmt.Sprintf("the %s of node %s (%s)", id.Role, id.Node, s.Creds)
	}
	return fmt.Sprintf("the %s credentials in %s", id.Role, s.Creds)
}

// Explain rewords what NATS says when it refuses a client: no or wrong
// credentials, a subject the credentials may not use (which NATS reports
// apart from the request, so the request itself only times out), or a
// certificate it cannot verify.
func Explain(err error, nc *nats.Conn, s Security) error {
	if err == nil {
		return nil
	}
	if nc != nil && !Refusal(err) {
		// The server refused the connection meanwhile (credentials that
		// expired): that is the cause, the request's failure its effect.
		if last := nc.LastError(); Refusal(last) {
			return Explain(fmt.Errorf("%w; %v", last, err), nil, s)
		}
	}
	if gone := s.Expired(time.Now()); gone != nil && (errors.Is(err, nats.ErrAuthorization) || authExpired(err)) {
		return fmt.Errorf("%w: %w", gone, err)
	}
	role := s.who()
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case authExpired(err):
		return fmt.Errorf("credentials expired: the server no longer accepts %s: %w", role, err)
	case authRevoked(err):
		return fmt.Errorf("credentials revoked: the server no longer accepts %s: %w", role, err)
	case errors.Is(err, nats.ErrAuthorization) && s.Creds == "":
		return fmt.Errorf("authorization violation: the server requires credentials; pass --creds FILE (`planner creds ROLE` makes one): %w", err)
	case errors.Is(err, nats.ErrAuthorization):
		return fmt.Errorf("authorization violation: the server refused %s (not made with the keys it trusts, or withdrawn): %w", role, err)
	case errors.As(err, &unknown) && s.TLSCA == "":
		return fmt.Errorf("TLS: the server's certificate is signed by an authority this client does not trust; pass --tls-ca with the CA that signed it: %w", err)
	case errors.As(err, &unknown):
		return fmt.Errorf("TLS: the server's certificate is not signed by the CA in --tls-ca %s: %w", s.TLSCA, err)
	case errors.As(err, &host):
		return fmt.Errorf("TLS: the server's certificate is not valid for %q, the host --server names: connect by a name or address the certificate holds, or give the server a certificate for this one: %w", host.Host, err)
	case errors.As(err, &invalid):
		return fmt.Errorf("TLS: the server's certificate is invalid (expired, or not for a server): %w", err)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fmt.Errorf("TLS: the server requires TLS: connect with a tls:// URL: %w", err)
	case errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Errorf("TLS: the server does not offer TLS; connect with a nats:// URL or enable TLS on the server: %w", err)
	case strings.Contains(err.Error(), "certificate"):
		return fmt.Errorf("TLS: the server's certificate cannot be verified: %w", err)
	}
	if nc != nil {
		if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return fmt.Errorf("permissions violation: %s may not do this: %v (%w)", role, last, err)
		}
	}
	return err
}
