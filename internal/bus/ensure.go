package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// How a create-or-update of a stream or bucket waits for its answer.
//
// A NATS cluster can drop the answer to one: a stream's create or
// update is answered by the stream's leader once the meta layer applies
// it, and a second planner's create or update of a stream that a third
// has just created is applied while the new stream's replicas are still
// electing their leader, so no server answers it. Three planners starting
// together on a cluster lost about two answers each that way, each
// costing the client's whole request timeout (5 s). The request is
// idempotent, so it is asked again after EnsureAttempt, doubling up to
// EnsureWithin, rather than waited on for a reply that never comes.
const (
	// EnsureAttempt is how long the first try waits: a healthy cluster
	// answers in tens of milliseconds, a loaded one in hundreds.
	EnsureAttempt = time.Second
	// EnsureWithin bounds the tries when ctx has no deadline: the
	// jetstream client's own request timeout, so a server that is away is
	// said as soon as before.
	EnsureWithin = 5 * time.Second
)

// RetryLost makes call, an idempotent JetStream request (a stream's or
// bucket's create-or-update), asking again while an answer does not come
// within the try's timeout: EnsureAttempt, doubling up to EnsureWithin,
// all within ctx's deadline, or EnsureWithin when ctx has none. Any
// answer (a refusal too) ends it; so does ctx, with its error.
func RetryLost[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	return retryLost(ctx, EnsureAttempt, EnsureWithin, call)
}

func retryLost[T any](ctx context.Context, first, within time.Duration, call func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	}
	for wait := first; ; wait = min(2*wait, within) {
		try, cancel := context.WithTimeout(ctx, wait)
		v, err := call(try)
		// Lost: this try's own timeout passed, not ctx's, and the call
		// says so (it did not fail for another reason meanwhile).
		lost := err != nil && errors.Is(err, context.DeadlineExceeded) && try.Err() != nil && ctx.Err() == nil
		cancel()
		if !lost {
			return v, err
		}
	}
}

// CreateOrUpdate makes a stream or bucket with create, and brings one
// that exists with other settings to them with update; each request asked
// again while its answer is lost (RetryLost). Unlike the jetstream
// client's CreateOrUpdate calls it does not update first: an update is
// proposed to the cluster even when nothing changes, and it drops the
// new stream's preferred leader, so a second planner's update of a
// stream a third had just made left its replicas to elect a leader by
// timeout (seconds), answering no one meanwhile. A create of a stream
// that exists with the same settings changes nothing and is answered at
// once; but a server alone (not clustered) checks its storage for it as
// if the stream's bytes were not reserved yet, so a create refused for
// storage is tried as an update, and only a stream that is not there
// takes the create's refusal.
func CreateOrUpdate[T any](ctx context.Context, create, update func(context.Context) (T, error)) (T, error) {
	v, err := RetryLost(ctx, create)
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return RetryLost(ctx, update)
	case IsInsufficient(err):
		uv, uerr := RetryLost(ctx, update)
		if errors.Is(uerr, jetstream.ErrStreamNotFound) || errors.Is(uerr, jetstream.ErrBucketNotFound) {
			return v, err
		}
		return uv, uerr
	}
	return v, err
}
