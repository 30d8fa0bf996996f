package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// Client asks poolplanner over one NATS connection.
type Client struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// New returns a client over nc, which the caller keeps and closes.
func New(nc *nats.Conn) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Client{nc: nc, js: js}, nil
}

// JetStream is the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// Request sends req (JSON-encoded unless it is []byte) to subject and
// decodes the reply into reply. An error reply comes back as one of the
// error kinds, wrapped with the server's description; a reply stored as
// an object (too large for a message) is fetched.
func (c *Client) Request(ctx context.Context, subject string, req, reply any) error {
	data, ok := req.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(req); err != nil {
			return fmt.Errorf("%s: %w", subject, err)
		}
	}
	return c.requestMsg(ctx, &nats.Msg{Subject: subject, Data: data}, reply)
}

// requestMsg sends m, a request, and decodes the reply into reply.
func (c *Client) requestMsg(ctx context.Context, m *nats.Msg, reply any) error {
	subject := m.Subject
	msg, err := c.nc.RequestMsgWithContext(ctx, m)
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
	if err := c.decodeBody(ctx, msg.Data, msg.Header, reply, objectRule{bucket: RepliesBucket, prefix: wire.ReplyObjectPrefix, limit: wire.MaxObject}); err != nil {
		return fmt.Errorf("%s: reply: %w", subject, err)
	}
	return nil
}

// objectRule is where a message's object may be, and how large: a
// message must not make its reader fetch anything anywhere.
type objectRule struct {
	bucket string
	// prefix, when set, begins the names allowed.
	prefix string
	limit  int64
}

// decodeBody decodes a message body into v, fetching it from its object
// when the message says it is stored as one, as far as rule allows.
func (c *Client) decodeBody(ctx context.Context, data []byte, h nats.Header, v any, rule objectRule) error {
	if h.Get(wire.ObjectHeader) == "" {
		if err := wire.DecodeWith(data, h, func(b []byte) error { return unmarshal(b, v) }); err != nil {
			return fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		return nil
	}
	var ref wire.ObjectRef
	if err := wire.Decode(data, h, &ref); err != nil {
		return fmt.Errorf("object reference: %w: %w", ErrUnreadable, err)
	}
	if ref.Bucket != rule.bucket || !strings.HasPrefix(ref.Object, rule.prefix) || strings.Contains(ref.Object[len(rule.prefix):], "/") {
		return fmt.Errorf("object reference %s/%s: %w: want one in %s", ref.Bucket, ref.Object, ErrUnreadable, rule.bucket)
	}
	// The message exists, so its object missing makes it unreadable.
	return unreadable(c.getObject(ctx, ref.Bucket, ref.Object, rule.limit, v))
}

// unmarshal is json.Unmarshal, but that an assignment, which a planner
// reads one per node, is read without reflection (decodeAssignment).
func unmarshal(data []byte, v any) error {
	if a, ok := v.(*Assignment); ok {
		return decodeAssignment(data, a)
	}
	return json.Unmarshal(data, v)
}

// getObject reads an object of gzipped JSON, expanding to at most limit
// bytes, into v.
func (c *Client) getObject(ctx context.Context, bucket, name string, limit int64, v any) error {
	obs, err := c.js.ObjectStore(ctx, bucket)
	if err != nil {
		return fmt.Errorf("object store %s: %w", bucket, err)
	}
	info, err := obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("object %s/%s: %w", bucket, name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("object %s/%s: %w", bucket, name, err)
	}
	if int64(info.Size) > limit {
		return fmt.Errorf("object %s/%s: %w: %d bytes, over %d", bucket, name, ErrUnreadable, info.Size, limit)
	}
	data, err := obs.GetBytes(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("object %s/%s: %w", bucket, name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("object %s/%s: %w", bucket, name, err)
	}
	if data, err = wire.Gunzip(data, limit); err != nil {
		return fmt.Errorf("object %s/%s: %w: %w", bucket, name, ErrUnreadable, err)
	}
	if err := unmarshal(data, v); err != nil {
		return fmt.Errorf("object %s/%s: %w: %w", bucket, name, ErrUnreadable, err)
	}
	return nil
}

// Lookup asks where worker index of component goes in the latest
// revision of plan name.
func (c *Client) Lookup(ctx context.Context, name, component string, index int) (*PlacedWorker, error) {
	var w PlacedWorker
	if err := c.Request(ctx, LookupSubject, wire.LookupRequest{Plan: name, Component: component, Index: &index}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// LookupNode asks for node's workers in the latest revision of plan name.
func (c *Client) LookupNode(ctx context.Context, name, node string) (*Assignment, error) {
	var a Assignment
	if err := c.Request(ctx, LookupSubject, wire.LookupRequest{Plan: name, NodeID: node}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// ValidateAs plans spec (JSON) as plan name's would be, on what the live
// inventory leaves it (the GPUs of other plans of its priority or higher
// taken; its own not), publishing nothing ("": a new plan's).
func (c *Client) ValidateAs(ctx context.Context, name string, spec []byte) (*ValidateReply, error) {
	msg := nats.NewMsg(ValidateSubject)
	msg.Data = spec
	if name != "" {
		msg.Header.Set(PlanHeader, name)
	}
	var r ValidateReply
	if err := c.requestMsg(ctx, msg, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate plans spec (JSON) as a new plan's, on what the live inventory
// leaves it (the GPUs of plans of its priority or higher taken),
// publishing nothing.
func (c *Client) Validate(ctx context.Context, spec []byte) (*ValidateReply, error) {
	var r ValidateReply
	if err := c.Request(ctx, ValidateSubject, spec, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// RequestPlan asks the service for revision rev of plan name (0: the
// latest). Plan reads the same from the stream, without a service.
func (c *Client) RequestPlan(ctx context.Context, name string, rev int) (*plan.Document, error) {
	var d plan.Document
	if err := c.Request(ctx, PlanSubject, wire.PlanRequest{Plan: name, Revision: rev}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}
