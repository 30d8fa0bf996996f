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
	MaxBytes  int      `json:"max_bytes,omitempty"`
}

// multiLastBytes is how many bytes one batched reply may bring before
// the server stops it (the rest is asked again): a listing of large
// documents is read a bounded part at a time.
const multiLastBytes = 8 << 20

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
	out, upTo, err := lastBatch(ctx, js.Conn(), subject, first, upTo, multiLastBytes)
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
			results[i], _, errs[i] = lastBatch(ctx, js.Conn(), subject, part, upTo, multiLastBytes)
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

// lastBatch is the last message of each of subjects as of upTo (0: as
// of the first answer), in as many batched direct gets as the server
// takes to send them: it stops a batch past a byte limit, saying how
// many messages it left (Nats-Num-Pending), and those subjects are asked
// again. A message of a subject not asked, or of one answered already,
// is an error: the listing is never silently short or wrong.
func lastBatch(ctx context.Context, nc *nats.Conn, subject string, subjects []string, upTo uint64, maxBytes int) ([]lastValue, uint64, error) {
	want := make(map[string]bool, len(subjects))
	for _, s := range subjects {
		want[s] = true
	}
	var out []lastValue
	rest := subjects
	for {
		got, up, pending, err := multiLast(ctx, nc, subject, rest, upTo, maxBytes)
		if err != nil {
			return nil, 0, err
		}
		if upTo == 0 {
			upTo = up
		}
		for _, v := range got {
			if !want[v.Subject] {
				return nil, 0, fmt.Errorf("batched direct get: a reply for subject %q, not asked or answered twice", v.Subject)
			}
			delete(want, v.Subject)
		}
		out = append(out, got...)
		if pending == 0 {
			return out, upTo, nil
		}
		if len(got) == 0 {
			return nil, 0, fmt.Errorf("batched direct get: the server sent nothing and says %d messages are pending", pending)
		}
		next := rest[:0:0]
		for _, s := range rest {
			if want[s] {
				next = append(next, s)
			}
		}
		rest = next
	}
}

// multiLast is one batched direct get: the messages, the stream
// sequence they are as of (the server's up_to_seq), and how many the
// server left unsent (a batch it stopped at its byte limit).
func multiLast(ctx context.Context, nc *nats.Conn, subject string, subjects []string, upTo uint64, maxBytes int) ([]lastValue, uint64, int, error) {
	req, err := json.Marshal(multiLastRequest{MultiLast: subjects, UpToSeq: upTo, MaxBytes: maxBytes})
	if err != nil {
		return nil, 0, 0, err
	}
	inbox := nc.NewInbox()
	// The replies come as a burst: room for them all, so none is
	// dropped as a slow consumer's.
	ch := make(chan *nats.Msg, len(subjects)+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("batched direct get: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, req); err != nil {
		return nil, 0, 0, fmt.Errorf("batched direct get: %w", err)
	}
	out := make([]lastValue, 0, len(subjects))
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return nil, 0, 0, fmt.Errorf("batched direct get: %w", ctx.Err())
		}
		// A stored message comes with the headers its publisher gave it
		// (a reporter may give any, Status and Nats-Subject included),
		// then the server's own, last: the server's Nats-Stream marks a
		// stored message, and its values are the last ones. A control
		// message (end of batch, none found) has none.
		if last(m.Header, jetstream.StreamHeader) != "" {
			seq, err := strconv.ParseUint(last(m.Header, jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return nil, 0, 0, fmt.Errorf("batched direct get: a reply without a sequence: %w", err)
			}
			out = append(out, lastValue{Subject: last(m.Header, jetstream.SubjectHeader), Seq: seq, Header: m.Header, Data: m.Data})
			continue
		}
		status := m.Header.Get("Status")
		switch {
		case status == "204":
			// End of batch: the sequence it holds to, for the batches
			// after, and what it left unsent.
			upTo, _ = strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
			pending, _ := strconv.Atoi(m.Header.Get("Nats-Num-Pending"))
			return out, upTo, pending, nil
		case status == "404" && len(out) == 0:
			return nil, upTo, 0, nil // none of these subjects has a message
		case status == "408" && len(out) == 0:
			// A server that does not know multi_last reads the request
			// as one without what it needs.
			return nil, 0, 0, fmt.Errorf("%w (%s %s)", errNoMultiLast, status, m.Header.Get("Description"))
		default:
			return nil, 0, 0, fmt.Errorf("batched direct get: status %s %s", status, m.Header.Get("Description"))
		}
	}
}

// last is the last value of header key in h ("": none).
func last(h nats.Header, key string) string {
	vs := h.Values(key)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}
