package bus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Backoff bounds.
const (
	BackoffMin = 100 * time.Millisecond
	BackoffMax = 5 * time.Second
)

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

// Connect dials url for a long-lived client named name. A server that is
// down at start is not an error: the connection keeps retrying, forever,
// with Backoff, and JetStream calls fail until it is up. Connection events
// are logged to log. extra options come last and win.
func Connect(url, name string, log zerolog.Logger, extra ...nats.Option) (*nats.Conn, error) {
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
			ev := log.Warn()
			if err != nil {
				ev = ev.Err(err)
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
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS async error")
		}),
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	if !nc.IsConnected() {
		log.Warn().Str("server", url).Msg("NATS not reachable yet; retrying in the background")
	}
	return nc, nil
}

// stopOnDone calls stop when ctx is done or when the returned channel is
// closed, whichever comes first: a reader closes it when its iterator
// ended on its own (a closed consumer), so no goroutine outlives it.
func stopOnDone(ctx context.Context, stop func()) chan<- struct{} {
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
