package cli

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// busyStore holds each request until released, counting how many are
// in it at once.
type busyStore struct {
	in, most atomic.Int64
	release  chan struct{}
}

func (b *busyStore) enter() {
	n := b.in.Add(1)
	for {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-b.release
	b.in.Add(-1)
}

func (b *busyStore) PutIf(context.Context, string, []byte, bool, time.Duration, uint64) (uint64, error) {
	b.enter()
	return 1, nil
}

func (b *busyStore) DeleteIf(context.Context, string, time.Duration, uint64) error {
	b.enter()
	return nil
}

func (b *busyStore) State(context.Context, string) (store.KeyState, error) {
	b.enter()
	return store.KeyState{}, nil
}

// TestPacedStore: however many reporters call at once, no more than the
// bound of their requests reach the store together, every one is served
// in the end, and one waiting for its turn gives up when its context
// ends, saying what it waited for.
func TestPacedStore(t *testing.T) {
	const bound, callers = 8, 200
	inner := &busyStore{release: make(chan struct{})}
	p := newPacedStore(inner, bound)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			switch i % 3 {
			case 0:
				_, _ = p.PutIf(ctx, "n", nil, false, time.Minute, 0)
			case 1:
				_ = p.DeleteIf(ctx, "n", time.Minute, 0)
			default:
				_, _ = p.State(ctx, "n")
			}
		})
	}
	for range callers {
		inner.release <- struct{}{}
	}
	wg.Wait()
	if m := inner.most.Load(); m > bound || m == 0 {
		t.Fatalf("%d requests in the store at once, want 1 to %d", m, bound)
	}
	// Every slot taken: a further request waits, and gives up with its
	// context.
	for range bound {
		wg.Go(func() { _, _ = p.State(ctx, "n") })
	}
	natstest.WaitFor(t, 10*time.Second, "every slot taken", func() bool { return inner.in.Load() == bound })
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.PutIf(cctx, "n7", nil, false, time.Minute, 0); !errors.Is(err, context.Canceled) || err.Error() != "put of node n7: waiting for the reporters' turn: context canceled" {
		t.Fatalf("a request past the bound with its context ended: %v", err)
	}
	for range bound {
		inner.release <- struct{}{}
	}
	wg.Wait()
}
