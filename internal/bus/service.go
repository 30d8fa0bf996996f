package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// ServiceVersion is the micro service's version.
const ServiceVersion = "0.1.0"

// errorReply maps a Go error to its wire code: the one place that decides
// how an error looks on the bus. Handlers mark errors with one of
// client's error kinds (client.ErrBadRequest...), by wrapping or with Kind.
func errorReply(err error) (code, desc string) {
	switch {
	case errors.Is(err, client.ErrBadRequest):
		return wire.CodeBadRequest, err.Error()
	case errors.Is(err, client.ErrNotFound):
		return wire.CodeNotFound, err.Error()
	case errors.Is(err, client.ErrInfeasible):
		return wire.CodeInfeasible, err.Error()
	default:
		return wire.CodeInternal, err.Error()
	}
}

// Kind marks err as kind, one of client's error kinds, without changing
// its text: what the requester reads is err's own words.
func Kind(kind, err error) error { return kindError{kind: kind, err: err} }

type kindError struct{ kind, err error }

func (e kindError) Error() string   { return e.err.Error() }
func (e kindError) Unwrap() []error { return []error{e.kind, e.err} }

// Handlers answer the service's endpoints, each with the value to send
// as JSON (a json.RawMessage as it is) or an error marked with one of
// client's error kinds.
type Handlers interface {
	// Validate plans spec as plan would be (its own GPUs not in the way;
	// "" for a plan not yet stored).
	Validate(ctx context.Context, spec []byte, plan string) (any, error)
	Lookup(ctx context.Context, req wire.LookupRequest) (any, error)
	Plan(ctx context.Context, req wire.PlanRequest) (any, error)
}

// HandlerTimeout bounds one request's work.
const HandlerTimeout = 10 * time.Second

// AddService registers the poolplanner micro service on nc, answering
// with a's handlers. Stop it with Stop(), which drains.
func AddService(nc *nats.Conn, a Handlers) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        client.ServiceName,
		Version:     ServiceVersion,
		Description: "poolplanner: validate specs, look up workers, read plans",
	})
	if err != nil {
		return nil, fmt.Errorf("add service %s: %w", client.ServiceName, err)
	}
	obs, _ := a.(RequestObserver)
	add := func(name, subject string, h func(context.Context, []byte, micro.Headers) (any, error)) error {
		// One piece of work at a time per endpoint, even one whose
		// requester was told it timed out: abandoned work never piles up.
		slot := make(chan struct{}, 1)
		return svc.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) {
			start := time.Now()
			if !ReplyAllowed(r.Reply()) {
				// Answering would publish into whatever subject the
				// request named: a stream's, say.
				if obs != nil {
					obs.ObserveRequest(name, CodeForbiddenReply, time.Since(start))
				}
				return
			}
			err := answer(nc, r, slot, h)
			if err != nil {
				respondErr(r, err)
			}
			if obs != nil {
				code := "200"
				if err != nil {
					code, _ = errorReply(err)
				}
				obs.ObserveRequest(name, code, time.Since(start))
			}
		}), micro.WithEndpointSubject(subject))
	}
	err = errors.Join(
		add("validate", client.ValidateSubject, func(ctx context.Context, data []byte, hdr micro.Headers) (any, error) {
			return validate(ctx, a, data, hdr)
		}),
		add("lookup", client.LookupSubject, func(ctx context.Context, data []byte, _ micro.Headers) (any, error) {
			var req wire.LookupRequest
			if err := decodeStrict(data, &req); err != nil {
				return nil, err
			}
			return a.Lookup(ctx, req)
		}),
		add("plan", client.PlanSubject, func(ctx context.Context, data []byte, _ micro.Headers) (any, error) {
			var req wire.PlanRequest
			if err := decodeStrict(data, &req); err != nil {
				return nil, err
			}
			return a.Plan(ctx, req)
		}),
	)
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("add service %s: %w", client.ServiceName, err)
	}
	return svc, nil
}

// validate answers a validate request: a spec, and the plan it is for
// in PlanHeader (none: a new plan).
func validate(ctx context.Context, a Handlers, data []byte, hdr micro.Headers) (any, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, fmt.Errorf("%w: empty request; send a job spec as JSON", client.ErrBadRequest)
	}
	return a.Validate(ctx, data, headerFold(hdr, client.PlanHeader))
}

// headerFold is header key's first value, the key's case aside (a
// client in another language may write it in lower case).
func headerFold(h micro.Headers, key string) string {
	for k, vs := range h {
		if strings.EqualFold(k, key) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// RequestObserver, when the Handlers are one too, hears of every answered
// request: its endpoint, its code (200, or the error's) and how long it
// took.
type RequestObserver interface {
	ObserveRequest(endpoint, code string, took time.Duration)
}

// CodeForbiddenReply is what the request metrics count for a request
// left unanswered because of its reply subject.
const CodeForbiddenReply = "403"

// ReplyAllowed says whether the service may answer to reply: a client's
// inbox (_INBOX...) or the reply the server made for a request that came
// through an account import (_R_...). Any other reply subject is refused:
// NATS does not check the reply subject a client names, and answering
// would publish wherever it points.
func ReplyAllowed(reply string) bool {
	return strings.HasPrefix(reply, "_INBOX.") || strings.HasPrefix(reply, "_R_.")
}

// ErrBusy answers a request that found its endpoint still at work on
// an earlier one past its deadline.
var ErrBusy = fmt.Errorf("%w: busy with an earlier request; try again", client.ErrInternal)

// answer answers r with h's reply; the error is what to answer instead.
// h runs under the request's deadline, holding slot; a request whose
// deadline passes is answered with a timeout, and the next one waits
// for the slot within its own deadline.
func answer(nc *nats.Conn, r micro.Request, slot chan struct{}, h func(context.Context, []byte, micro.Headers) (any, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), HandlerTimeout)
	defer cancel()
	if n := len(r.Data()); n > MaxRequest {
		return fmt.Errorf("%w: a request of %d bytes; at most %d", client.ErrBadRequest, n, MaxRequest)
	}
	v, err := within(ctx, slot, func() (any, error) { return h(ctx, r.Data(), r.Headers()) })
	if err != nil {
		return err
	}
	data, hdr, err := wire.Encode(v)
	if err == nil && len(data) > BodyLimit(nc) {
		data, hdr, err = replyObject(ctx, nc, data, hdr)
	}
	if err != nil {
		return fmt.Errorf("%w: encode reply: %w", client.ErrInternal, err)
	}
	if err := r.Respond(data, micro.WithHeaders(micro.Headers(hdr))); err != nil {
		return fmt.Errorf("%w: send reply: %w", client.ErrInternal, err)
	}
	return nil
}

// within runs work holding slot and returns its result, or an error as
// soon as ctx ends: work that ignores ctx finishes in the background and
// gives the slot back then.
func within(ctx context.Context, slot chan struct{}, work func() (any, error)) (any, error) {
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return nil, ErrBusy
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-slot }()
		v, err := work()
		done <- result{v, err}
	}()
	select {
	case res := <-done:
		return res.v, res.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: the request took longer than %s", client.ErrInternal, HandlerTimeout)
	}
}

func respondErr(r micro.Request, err error) {
	code, desc := errorReply(err)
	body, _ := json.Marshal(map[string]string{"error": desc})
	// micro puts the description in a header; keep it one line.
	_ = r.Error(code, strings.Join(strings.Fields(desc), " "), body)
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request is not the expected JSON: %w", client.ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: request has more after its JSON object", client.ErrBadRequest)
	}
	return nil
}

// Request sends req to subject and decodes the reply into reply, as
// client.Client.Request does.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	return c.Request(ctx, subject, req, reply)
}

// MaxRequest bounds a request's body: a job spec is a few KB.
const MaxRequest = 256 << 10

// replyObject stores a reply too large for a message (data, encoded as
// h says) in the replies bucket, where it stays RepliesTTL, and returns
// the message that points at it.
func replyObject(ctx context.Context, nc *nats.Conn, data []byte, h nats.Header) ([]byte, nats.Header, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	if h.Get(wire.EncodingHeader) == "" {
		if data, err = wire.Gzip(data); err != nil {
			return nil, nil, err
		}
	}
	name := wire.ReplyObjectPrefix + nuid.Next()
	size, err := StoreGzipped(ctx, js, client.RepliesBucket, name, data)
	if err != nil {
		return nil, nil, fmt.Errorf("store reply: %w", err)
	}
	ref, _ := json.Marshal(wire.ObjectRef{Bucket: client.RepliesBucket, Object: name, Size: uint64(size)})
	return ref, nats.Header{wire.ObjectHeader: []string{"1"}}, nil
}
