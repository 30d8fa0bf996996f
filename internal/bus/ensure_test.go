package bus

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestRetryLost: a try whose answer does not come within its timeout is
// asked again, with a longer timeout, until an answer (a refusal too)
// or the end of ctx; a ctx without deadline bounds the tries by within.
func TestRetryLost(t *testing.T) {
	const first, within = 20 * time.Millisecond, 200 * time.Millisecond
	refused := errors.New("refused")
	// Each try does what its letter says: a, answer; r, refuse; l, lose
	// the answer (wait for the try's end); c, cancel ctx, then lose.
	for _, c := range []struct {
		name     string
		script   string
		deadline time.Duration // ctx's; 0: none
		tries    int
		err      error
	}{
		{"answered", "a", 0, 1, nil},
		{"refused", "r", 0, 1, refused},
		{"lost, then answered", "la", 0, 2, nil},
		{"lost twice, then refused", "llr", 0, 3, refused},
		{"never answered, no deadline", "llllllllll", 0, -1, context.DeadlineExceeded},
		{"never answered, ctx's deadline", "llllllllll", 70 * time.Millisecond, -1, context.DeadlineExceeded},
		{"cancelled while waiting", "cl", 0, 1, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.deadline > 0 {
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
				defer cancel()
			}
			var waits []time.Duration
			start := time.Now()
			v, err := retryLost(ctx, first, within, func(try context.Context) (int, error) {
				n := len(waits)
				d, ok := try.Deadline()
				if !ok {
					t.Fatalf("try %d has no deadline", n+1)
				}
				waits = append(waits, time.Until(d))
				switch c.script[n] {
				case 'a':
					return n + 1, nil
				case 'r':
					return 0, refused
				case 'c':
					cancel()
				}
				<-try.Done()
				return 0, try.Err()
			})
			took := time.Since(start)
			if !errors.Is(err, c.err) {
				t.Fatalf("error %v, want %v", err, c.err)
			}
			if c.tries > 0 && len(waits) != c.tries {
				t.Fatalf("%d tries, want %d", len(waits), c.tries)
			}
			if c.tries < 0 && len(waits) < 2 {
				t.Fatalf("%d tries of a lost answer, want it asked again", len(waits))
			}
			if err == nil && v != len(waits) {
				t.Fatalf("value %d, want the answering try's (%d)", v, len(waits))
			}
			// Each try waits at most twice the one before, from first, and
			// never past ctx's end; all of them end by within or ctx's
			// deadline.
			limit := first
			for i, w := range waits {
				if w > limit {
					t.Errorf("try %d waits %s, want at most %s", i+1, w, limit)
				}
				limit = min(2*limit, within)
			}
			if bound := max(c.deadline, within); c.err == context.DeadlineExceeded && took > 5*bound {
				t.Errorf("gave up after %s, want about %s", took, bound)
			}
		})
	}
}

// TestCreateOrUpdate: create first; update only where a stream of that
// name exists with other settings, or where a create is refused for
// storage (whose refusal stands where there is nothing to update); any
// other refusal is the answer.
func TestCreateOrUpdate(t *testing.T) {
	inUse := fmt.Errorf("bucket exists: %w", jetstream.ErrStreamNameAlreadyInUse)
	refused := errors.New("refused")
	noRoom := &jetstream.APIError{Code: 500, ErrorCode: 10047, Description: "insufficient storage resources available"}
	for _, c := range []struct {
		name           string
		create, update error
		calls          string
		err            error
	}{
		{"made, or there with the same settings", nil, nil, "c", nil},
		{"there with other settings", inUse, nil, "cu", nil},
		{"there with other settings, update refused", inUse, refused, "cu", refused},
		{"create refused", refused, nil, "c", refused},
		// A server alone checks a create of a stream it has as if new.
		{"no room for it again", noRoom, nil, "cu", nil},
		{"no room for it again, update refused", noRoom, refused, "cu", refused},
		{"no room, not there", noRoom, jetstream.ErrStreamNotFound, "cu", noRoom},
		{"no room, no bucket", noRoom, fmt.Errorf("%w: b", jetstream.ErrBucketNotFound), "cu", noRoom},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls string
			_, err := CreateOrUpdate(context.Background(),
				func(context.Context) (int, error) { calls += "c"; return 1, c.create },
				func(context.Context) (int, error) { calls += "u"; return 2, c.update })
			if !errors.Is(err, c.err) || calls != c.calls {
				t.Fatalf("calls %q, error %v; want %q, %v", calls, err, c.calls, c.err)
			}
		})
	}
}
