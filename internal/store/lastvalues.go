package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// multiLastMax is how many subjects one batched direct get may name: the
// server answers at most 1,024 messages to a multi_last request.
const multiLastMax = 1024

// errNoMultiLast is a server that does not answer batched direct gets
// (nats-server before 2.11): the caller reads key by key instead.
var errNoMultiLast = errors.New("the server does not answer batched direct gets")

// lastValue is the last message of one subject, as a batched direct get
// returns it.
type lastValue struct {
	Subject string
	Seq     uint64
	Header  nats.Header
	Data    []byte
}

// multiLastRequest is the direct get API's request for the last message
// of each of a list of subjects, as of one stream sequence.
type multiLastRequest struct {
	MultiLast []string `json:"multi_last"`
	UpToSeq   uint64   `json:"up_to_seq,omitempty"`
}

// lastValues reads the last message of each of subjects (literal
// subjects of stream) up to stream sequence upTo (0: the stream's last
// when the first request is answered, then held for the rest), in
// batched direct gets of multiLastMax subjects, window of them at once:
// 20,000 keys are twenty round trips, not 20,000. Subjects without a
// message are left out. errNoMultiLast where the server does not batch.
func lastValues(ctx context.Context, js jetstream.JetStream, apiPrefix, stream string, subjects []string, upTo uint64, window int) ([]lastValue, error) {
	if len(subjects) == 0 {
		return nil, nil
	}
	subject := apiPrefix + "DIRECT.GET." + stream
	first := subjects[:min(multiLastMax, len(subjects))]
	out, upTo, err := multiLast(ctx, js.Conn(), subject, first, upTo)
	if err != nil {
		return nil, err
	}
	rest := subjects[len(first):]
	batches := (len(rest) + multiLastMax - 1) / multiLastMax
	results := make([][]lastValue, batches)
	errs := make([]error, batches)
	slots := make(chan struct{}, max(window, 1))
	done := make(chan struct{}, batches)
	for i := range batches {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; done <- struct{}{} }()
			part := rest[i*multiLastMax : min((i+1)*multiLastMax, len(rest))]
			results[i], _, errs[i] = multiLast(ctx, js.Conn(), subject, part, upTo)
		}()
	}
	for range batches {
		<-done
	}
	for i, err := range errs {
		if err != nil {
			return nil, err
		}
		out = append(out, results[i]...)
	}
	return out, nil
}

// multiLast is one batched direct get: the messages, and the stream
// sequence they are as of (the server's up_to_seq).
func multiLast(ctx context.Context, nc *nats.Conn, subject string, subjects []string, upTo uint64) ([]lastValue, uint64, error) {
	req, err := json.Marshal(multiLastRequest{MultiLast: subjects, UpToSeq: upTo})
	if err != nil {
		return nil, 0, err
	}
	inbox := nc.NewInbox()
	// The replies come as a burst: room for them all, so none is
	// dropped as a slow consumer's.
	ch := make(chan *nats.Msg, len(subjects)+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, 0, fmt.Errorf("batched direct get: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, req); err != nil {
		return nil, 0, fmt.Errorf("batched direct get: %w", err)
	}
	out := make([]lastValue, 0, len(subjects))
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("batched direct get: %w", ctx.Err())
		}
		status := m.Header.Get("Status")
		switch {
		case status == "":
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return nil, 0, fmt.Errorf("batched direct get: a reply without a sequence: %w", err)
			}
			out = append(out, lastValue{Subject: m.Header.Get(jetstream.SubjectHeader), Seq: seq, Header: m.Header, Data: m.Data})
		case status == "204":
			// End of batch: the sequence it holds to, for the batches
			// after.
			upTo, _ = strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
			return out, upTo, nil
		case status == "404" && len(out) == 0:
			return nil, upTo, nil // none of these subjects has a message
		case status == "408" && len(out) == 0:
			// A server that does not know multi_last reads the request
			// as one without what it needs.
			return nil, 0, fmt.Errorf("%w (%s %s)", errNoMultiLast, status, m.Header.Get("Description"))
		default:
			return nil, 0, fmt.Errorf("batched direct get: status %s %s", status, m.Header.Get("Description"))
		}
	}
}
