package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/plan"
)

// The bus's error kinds. Every error a handler returns is one of these on
// the wire (errorReply decides which, in one place), and the client turns
// the code back into the same sentinel, so callers branch with errors.Is
// on either side.
var (
	ErrBadRequest = errors.New("bad request")
	ErrNotFound   = errors.New("not found")
	ErrInfeasible = errors.New("infeasible")
	ErrInternal   = errors.New("internal error")
)

// Wire codes of the error kinds, sent in micro's Nats-Service-Error-Code.
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeInfeasible = "422"
	CodeInternal   = "500"
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

// codeErr is the inverse of errorReply, for clients.
func codeErr(code string) error {
	switch code {
	case CodeBadRequest:
		return ErrBadRequest
	case CodeNotFound:
		return ErrNotFound
	case CodeInfeasible:
		return ErrInfeasible
	}
	return ErrInternal
}

// LookupRequest asks where a worker goes (Component and Index) or where a
// node's workers go (NodeID). Revision 0 means the latest plan.
type LookupRequest struct {
	Plan      string `json:"plan"`
	Component string `json:"component,omitempty"`
	Index     *int   `json:"index,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
	Revision  int    `json:"revision,omitempty"`
}

// PlacedWorker is a Worker with what a launcher needs to start it.
type PlacedWorker struct {
	planner.Worker
	// CUDAVisibleDevices is the value for CUDA_VISIBLE_DEVICES: the GPU
	// UUIDs when known (they survive device reordering), else the
	// node-local indices; empty for a worker without GPUs.
	CUDAVisibleDevices string `json:"cuda_visible_devices"`
	// Plan and Revision say which plan version the answer comes from.
	Plan     string `json:"plan"`
	Revision int    `json:"revision"`
}

// NodeWorkers is the reply to a lookup by node.
type NodeWorkers struct {
	Plan     string         `json:"plan"`
	Revision int            `json:"revision"`
	NodeID   string         `json:"node_id"`
	Workers  []PlacedWorker `json:"workers"`
}

// PlanRequest asks for plan Plan, its latest version or Revision.
type PlanRequest struct {
	Plan     string `json:"plan"`
	Revision int    `json:"revision,omitempty"`
}

// ValidateReply is the reply to validate: the plan the spec would get on
// the live inventory, with valid and error as in the plan document.
type ValidateReply struct {
	*planner.Plan
	// Nodes is how many nodes the live inventory had.
	Nodes int `json:"nodes"`
}

// appendJSON writes the worker's fields and the placement's, as
// encoding/json would: lookups are the service's hottest reply.
func (pw PlacedWorker) appendJSON(b []byte) []byte {
	b = pw.Worker.AppendJSON(b)
	b = b[:len(b)-1] // reopen the worker's object
	b = append(b, `,"cuda_visible_devices":`...)
	b = plan.AppendString(b, pw.CUDAVisibleDevices)
	b = append(b, `,"plan":`...)
	b = plan.AppendString(b, pw.Plan)
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, int64(pw.Revision), 10)
	return append(b, '}')
}

// Place returns w with its CUDA_VISIBLE_DEVICES value.
func Place(p *planner.Plan, w planner.Worker) PlacedWorker {
	pw := PlacedWorker{Worker: w, Plan: p.Name, Revision: p.Revision}
	switch {
	case len(w.GPUUUIDs) == len(w.GPUs) && len(w.GPUs) > 0:
		pw.CUDAVisibleDevices = strings.Join(w.GPUUUIDs, ",")
	case len(w.GPUs) > 0:
		s := make([]string, len(w.GPUs))
		for i, g := range w.GPUs {
			s[i] = fmt.Sprint(g)
		}
		pw.CUDAVisibleDevices = strings.Join(s, ",")
	}
	return pw
}

// Answerer is what the service asks; the planner service implements it.
type Answerer interface {
	Validate(ctx context.Context, spec []byte) (*ValidateReply, error)
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
	add := func(name, subject string, h func(context.Context, []byte) (any, error)) error {
		return svc.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) {
			ctx, cancel := context.WithTimeout(context.Background(), HandlerTimeout)
			defer cancel()
			v, err := h(ctx, r.Data())
			if err != nil {
				respondErr(r, err)
				return
			}
			data, h, err := EncodeJSON(v)
			if err == nil {
				err = checkPayload(nc, "the reply", len(data))
			}
			if err != nil {
				respondErr(r, fmt.Errorf("%w: encode reply: %w", ErrInternal, err))
				return
			}
			if err := r.Respond(data, micro.WithHeaders(micro.Headers(h))); err != nil {
				respondErr(r, fmt.Errorf("%w: send reply: %w", ErrInternal, err))
			}
		}), micro.WithEndpointSubject(subject))
	}
	err = errors.Join(
		add("validate", ValidateSubject, func(ctx context.Context, data []byte) (any, error) {
			if len(strings.TrimSpace(string(data))) == 0 {
				return nil, fmt.Errorf("%w: empty request; send a job spec as JSON", ErrBadRequest)
			}
			return a.Validate(ctx, data)
		}),
		add("lookup", LookupSubject, func(ctx context.Context, data []byte) (any, error) {
			var req LookupRequest
			if err := decodeStrict(data, &req); err != nil {
				return nil, err
			}
			return Lookup(ctx, a, req)
		}),
		add("plan", PlanSubject, func(ctx context.Context, data []byte) (any, error) {
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
	case byWorker && planner.Component(req.Component).Rank() < 0:
		return nil, fmt.Errorf("%w: component %q: want train, eval, env or buffer", ErrBadRequest, req.Component)
	}
	p, err := a.Plan(ctx, PlanRequest{Plan: req.Plan, Revision: req.Revision})
	if err != nil {
		return nil, err
	}
	if !p.Valid {
		return nil, fmt.Errorf("%w: plan %s revision %d is not valid: %s", ErrInfeasible, p.Name, p.Revision, p.Error)
	}
	if byNode {
		out := NodeWorkers{Plan: p.Name, Revision: p.Revision, NodeID: req.NodeID, Workers: []PlacedWorker{}}
		for _, w := range p.Workers.All() {
			if w.NodeID == req.NodeID {
				out.Workers = append(out.Workers, Place(p, *w))
			}
		}
		return out, nil
	}
	if w := p.Workers.Find(planner.Component(req.Component), *req.Index); w != nil {
		return Place(p, *w), nil
	}
	return nil, fmt.Errorf("%w: plan %s revision %d has no %s worker %d", ErrNotFound, p.Name, p.Revision, req.Component, *req.Index)
}

// Request sends req (JSON-encoded unless it is []byte) to subject and
// decodes the reply into reply; an error reply comes back as one of the
// error kinds, wrapped with the server's description.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	data, ok := req.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(req); err != nil {
			return fmt.Errorf("%s: %w", subject, err)
		}
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%s: no planner is serving (start `planner serve`): %w", subject, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		desc := msg.Header.Get(micro.ErrorHeader)
		var body struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(msg.Data, &body) == nil && body.Error != "" {
			desc = body.Error
		}
		return fmt.Errorf("%w: %s", codeErr(code), strings.TrimPrefix(desc, codeErr(code).Error()+": "))
	}
	if err := DecodeJSON(msg.Data, msg.Header, reply); err != nil {
		return fmt.Errorf("%s: reply: %w", subject, err)
	}
	return nil
}
