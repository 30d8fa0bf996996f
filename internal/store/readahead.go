package store

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
)

// readAheadWindow is how many values of the initial state a watch reads
// at once: the watch delivers headers only, and reading 20,000 nodes'
// documents one request after another took seconds of a cold start.
const readAheadWindow = 64

// delivery is a message of the watch with, for one of the initial state,
// its value already read and decoded (nil: read it when it comes).
type delivery struct {
	msg jetstream.Msg
	pre chan fetched
}

// fetched is a value read ahead: err, the read's error (the value
// cannot be read); decodeErr, the document's.
type fetched struct {
	inv       inventory.NodeInventory
	decodeErr error
	err       error
}

// readAhead passes msgs on in order; for the first initial of them (the
// state when the watch began: one message per key) it reads and decodes
// each value in the background, readAheadWindow at a time, so that the
// initial state costs one pass, not a round trip per node. Later
// messages are read as they come, as the watcher decides (a heartbeat of
// a known key needs no read).
func readAhead(ctx context.Context, s *InventoryStore, msgs <-chan jetstream.Msg, initial uint64) <-chan delivery {
	out := make(chan delivery, readAheadWindow)
	go func() {
		defer close(out)
		slots := make(chan struct{}, readAheadWindow)
		var n uint64
		for msg := range msgs {
			d := delivery{msg: msg}
			if n < initial && removal(msg.Headers()) == "" {
				d.pre = make(chan fetched, 1)
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
				go func(msg jetstream.Msg, pre chan<- fetched) {
					defer func() { <-slots }()
					pre <- fetch(ctx, s, msg)
				}(msg, d.pre)
			}
			n++
			select {
			case out <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// fetch reads and decodes the value msg (headers only) announces.
func fetch(ctx context.Context, s *InventoryStore, msg jetstream.Msg) fetched {
	nodeID, _ := strings.CutPrefix(msg.Subject(), bus.InventorySubjectPrefix)
	md, err := msg.Metadata()
	if err != nil {
		return fetched{err: err}
	}
	kv, err := s.KV(ctx)
	if err != nil {
		return fetched{err: err}
	}
	e, err := kv.GetRevision(ctx, nodeID, md.Sequence.Stream)
	if err != nil {
		return fetched{err: err}
	}
	var f fetched
	f.decodeErr = inventory.DecodeShared(e.Value(), &f.inv, s.shared)
	return f
}
