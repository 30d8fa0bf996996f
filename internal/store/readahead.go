package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
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
	var value []byte
	e, err := kv.GetRevision(ctx, nodeID, md.Sequence.Stream)
	switch {
	case err == nil:
		value = e.Value()
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// A direct get may be answered by a replica that has not yet
		// stored what the consumer just delivered; skipped, the node
		// would wait for its next heartbeat (seconds) to be read. The
		// stream's leader has it unless it is gone (superseded, expired).
		if value, err = s.leaderValue(ctx, msg.Subject(), md.Sequence.Stream); err != nil {
			return fetched{err: err}
		}
	default:
		return fetched{err: err}
	}
	var f fetched
	f.decodeErr = inventory.DecodeShared(value, &f.inv, s.shared)
	return f
}

// leaderValue is the value of the message at seq on subject as the
// stream's leader has it; jetstream.ErrKeyNotFound where the leader has
// no such message (or another subject's there, or a removal's).
func (s *InventoryStore) leaderValue(ctx context.Context, subject string, seq uint64) ([]byte, error) {
	m, err := leaderGet(ctx, s.js, bus.InventoryStream, map[string]uint64{"seq": seq})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, jetstream.ErrKeyNotFound
	case err != nil:
		return nil, fmt.Errorf("read %s at %d from the stream's leader: %w", subject, seq, err)
	case m.Subject != subject:
		return nil, jetstream.ErrKeyNotFound
	}
	if len(m.Header) > 0 {
		if h, err := nats.DecodeHeadersMsg(m.Header); err == nil && removal(h) != "" {
			return nil, jetstream.ErrKeyNotFound
		}
	}
	return m.Data, nil
}
