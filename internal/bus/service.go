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
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// The bus's error kinds, package client's: every error a handler returns
// is one of these on the wire (errorReply decides which, in one place),
// and the client turns the code back into the same sentinel, so callers
// branch with errors.Is on either side.
var (
	ErrBadRequest = client.ErrBadRequest
	ErrNotFound   = client.ErrNotFound
	ErrInfeasible = client.ErrInfeasible
	ErrInternal   = client.ErrInternal
)

// Wire codes of the error kinds.
const (
	CodeBadRequest = client.CodeBadRequest
	CodeNotFound   = client.CodeNotFound
	CodeInfeasible = client.CodeInfeasible
	CodeInternal   = client.CodeInternal
)

// The service's requests and replies, package client's.
type (
	LookupRequest = client.LookupRequest
	PlanRequest   = client.PlanRequest
	PlacedWorker  = client.PlacedWorker
	NodeWorkers   = client.Assignment
	ValidateReply = client.ValidateReply
)

// ServiceVersion is the micro service's version.
const ServiceVersion = "0.1.0"

// errorReply maps a Go error to its wire code: the one place that decides
// how an error looks on the bus.
func errorReply(err error) (code, desc string) {
	var fe *planner.FieldError
	var pe *planner.PlanError
	switch {
	case errors.Is(err, ErrBadRequest), errors.As(err, &fe):
		return CodeBadRequest, err.Error()
	case errors.Is(err, ErrNotFound):
		return CodeNotFound, err.Error()
	case errors.Is(err, ErrInfeasible), errors.As(err, &pe):
		return CodeInfeasible, err.Error()
	default:
		return CodeInternal, err.Error()
	}
}

// Place returns w of plan p with its CUDA_VISIBLE_DEVICES value.
func Place(p *planner.Plan, w plan.Worker) PlacedWorker {
	return client.Place(p.Name, p.Revision, w)
}

// Answerer is what the service asks; the planner service implements it.
type Answerer interface {
	// Validate plans spec as plan would be (its own GPUs not in the way;
	// "" for a plan not yet stored).
	Validate(ctx context.Context, spec []byte, plan string) (*ValidateReply, error)
	Plan(ctx context.Context, req PlanRequest) (*planner.Plan, error)
}

// HandlerTimeout bounds one request's work.
const HandlerTimeout = 10 * time.Second

// AddService registers the poolplanner micro service on nc, answering
// from a. Stop it with Stop(), which drains.
func AddService(nc *nats.Conn, a Answerer) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ServiceVersion,
		Description: "poolplanner: validate specs, look up workers, read plans",
	})
	if err != nil {
		return nil, fmt.Errorf("add service %s: %w", ServiceName, err)
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
		add("validate", ValidateSubject, func(ctx context.Context, data []byte, hdr micro.Headers) (any, error) {
			return validate(ctx, a, data, hdr)
		}),
		add("lookup", LookupSubject, func(ctx context.Context, data []byte, _ micro.Headers) (any, error) {
			var req LookupRequest
			if err := decodeStrict(data, &req); err != nil {
				return nil, err
			}
			return Lookup(ctx, a, req)
		}),
		add("plan", PlanSubject, func(ctx context.Context, data []byte, _ micro.Headers) (any, error) {
			var req PlanRequest
			if err := decodeStrict(data, &req); err != nil {
				return nil, err
			}
			return a.Plan(ctx, req)
		}),
	)
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("add service %s: %w", ServiceName, err)
	}
	return svc, nil
}

// validate answers a validate request: a spec, and the plan it is for
// in PlanHeader (none: a new plan).
func validate(ctx context.Context, a Answerer, data []byte, hdr micro.Headers) (any, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, fmt.Errorf("%w: empty request; send a job spec as JSON", ErrBadRequest)
	}
	plan := headerFold(hdr, client.PlanHeader)
	if plan != "" {
		if err := ValidatePlanName(plan); err != nil {
			return nil, fmt.Errorf("%s header: %w", client.PlanHeader, err)
		}
	}
	return a.Validate(ctx, data, plan)
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

// RequestObserver, when the Answerer is one too, hears of every answered
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
var ErrBusy = fmt.Errorf("%w: busy with an earlier request; try again", ErrInternal)

// answer answers r with h's reply; the error is what to answer instead.
// h runs under the request's deadline, holding slot; a request whose
// deadline passes is answered with a timeout, and the next one waits
// for the slot within its own deadline.
func answer(nc *nats.Conn, r micro.Request, slot chan struct{}, h func(context.Context, []byte, micro.Headers) (any, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), HandlerTimeout)
	defer cancel()
	if n := len(r.Data()); n > MaxRequest {
		return fmt.Errorf("%w: a request of %d bytes; at most %d", ErrBadRequest, n, MaxRequest)
	}
	v, err := within(ctx, slot, func() (any, error) { return h(ctx, r.Data(), r.Headers()) })
	if err != nil {
		return err
	}
	data, hdr, err := EncodeJSON(v)
	if err == nil && len(data) > BodyLimit(nc) {
		data, hdr, err = replyObject(ctx, nc, data, hdr)
	}
	if err != nil {
		return fmt.Errorf("%w: encode reply: %w", ErrInternal, err)
	}
	if err := r.Respond(data, micro.WithHeaders(micro.Headers(hdr))); err != nil {
		return fmt.Errorf("%w: send reply: %w", ErrInternal, err)
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
		return nil, fmt.Errorf("%w: the request took longer than %s", ErrInternal, HandlerTimeout)
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
		return fmt.Errorf("%w: request is not the expected JSON: %w", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: request has more after its JSON object", ErrBadRequest)
	}
	return nil
}

// Lookup answers a lookup request from the plan a gives.
func Lookup(ctx context.Context, a Answerer, req LookupRequest) (any, error) {
	byNode := req.NodeID != ""
	byWorker := req.Component != "" || req.Index != nil
	switch {
	case byNode && byWorker:
		return nil, fmt.Errorf("%w: give component and index, or node_id, not both", ErrBadRequest)
	case !byNode && (req.Component == "" || req.Index == nil):
		return nil, fmt.Errorf("%w: give component and index, or node_id", ErrBadRequest)
	case byWorker && *req.Index < 0:
		return nil, fmt.Errorf("%w: index %d: must be >= 0", ErrBadRequest, *req.Index)
	case byWorker && plan.Component(req.Component).Rank() < 0:
		return nil, fmt.Errorf("%w: component %q: want train, eval, env or buffer", ErrBadRequest, req.Component)
	}
	if byNode {
		if err := ValidateNodeID(req.NodeID); err != nil {
			return nil, fmt.Errorf("%w: node_id: %w", ErrBadRequest, err)
		}
	}
	p, err := a.Plan(ctx, PlanRequest{Plan: req.Plan, Revision: req.Revision})
	if err != nil {
		return nil, err
	}
	if !p.Placed() {
		return nil, fmt.Errorf("%w: plan %s revision %d is not valid: %s", ErrInfeasible, p.Name, p.Revision, p.Error)
	}
	if byNode {
		out := NodeWorkers{Plan: p.Name, Revision: p.Revision, NodeID: req.NodeID, Workers: []PlacedWorker{}}
		for _, w := range p.OnNode(req.NodeID) {
			out.Workers = append(out.Workers, Place(p, w))
		}
		return out, nil
	}
	if w := p.Workers.Find(plan.Component(req.Component), *req.Index); w != nil {
		return Place(p, *w), nil
	}
	for _, u := range p.Unplaced {
		if string(u.Component) == req.Component && u.Index == *req.Index {
			where := ""
			if u.NodeID != "" {
				where = fmt.Sprintf("; it returns to node %s GPUs %v when they hold again", u.NodeID, u.GPUs)
			}
			return nil, fmt.Errorf("%w: plan %s revision %d is degraded: %s worker %d is unplaced: %s%s", ErrInfeasible, p.Name, p.Revision, req.Component, *req.Index, u.Reason, where)
		}
	}
	return nil, fmt.Errorf("%w: plan %s revision %d has no %s worker %d", ErrNotFound, p.Name, p.Revision, req.Component, *req.Index)
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
	if h.Get(client.EncodingHeader) == "" {
		if data, err = client.Gzip(data); err != nil {
			return nil, nil, err
		}
	}
	name := client.ReplyObjectPrefix + nuid.Next()
	size, err := storeGzipped(ctx, js, client.RepliesBucket, name, data)
	if err != nil {
		return nil, nil, fmt.Errorf("store reply: %w", err)
	}
	ref, _ := json.Marshal(client.ObjectRef{Bucket: client.RepliesBucket, Object: name, Size: uint64(size)})
	return ref, nats.Header{client.ObjectHeader: []string{"1"}}, nil
}
