package cli

import (
	"context"
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
// bound of their requests reach the store together and every one is
// served in the end; a request's deadline counts from its turn, not from
// its wait; once the reporters' life ends nobody waits.
func TestPacedStore(t *testing.T) {
	const bound, callers = 8, 200
	inner := &busyStore{release: make(chan struct{})}
	life, end := context.WithCancel(context.Background())
	defer end()
	p := newPacedStore(life, inner, bound)
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
	// Every slot taken: a further request waits past its own deadline,
	// then reaches the store with its whole budget.
	for range bound {
		wg.Go(func() { _, _ = p.State(ctx, "n") })
	}
	natstest.WaitFor(t, 10*time.Second, "every slot taken", func() bool { return inner.in.Load() == bound })
	got := make(chan time.Duration, 1)
	deadlined := &deadlineStore{got: got}
	q := &pacedStore{inner: deadlined, slots: p.slots, life: life}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	wg.Go(func() { _, _ = q.State(dctx, "n7") })
	<-dctx.Done() // its deadline passes while it waits
	inner.release <- struct{}{}
	if left := <-got; left <= 0 || left > 50*time.Millisecond {
		t.Fatalf("the request reached the store with %v of its 50ms left", left)
	}
	// The reporters' life ends: nobody waits for a turn.
	end()
	if err := q.DeleteIf(ctx, "n8", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if left := <-got; left >= 0 {
		t.Fatalf("a request without a deadline reached the store with one (%v)", left)
	}
	for range bound - 1 {
		inner.release <- struct{}{}
	}
	wg.Wait()
}

// deadlineStore tells got how much of its deadline each request has
// left on arrival (-1: none).
type deadlineStore struct{ got chan<- time.Duration }

func (d *deadlineStore) left(ctx context.Context) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.got <- left
}

func (d *deadlineStore) PutIf(ctx context.Context, _ string, _ []byte, _ bool, _ time.Duration, _ uint64) (uint64, error) {
	d.left(ctx)
	return 1, ctx.Err()
}

func (d *deadlineStore) DeleteIf(ctx context.Context, _ string, _ time.Duration, _ uint64) error {
	d.left(ctx)
	return ctx.Err()
}

func (d *deadlineStore) State(ctx context.Context, _ string) (store.KeyState, error) {
	d.left(ctx)
	return store.KeyState{}, ctx.Err()
}
