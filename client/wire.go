package client

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// The service's error kinds. An error reply carries one as its code; the
// client turns the code back into the same error, so callers branch with
// errors.Is on either side.
var (
	ErrBadRequest = errors.New("bad request")
	ErrNotFound   = errors.New("not found")
	ErrInfeasible = errors.New("infeasible")
	ErrInternal   = errors.New("internal error")
	// ErrUnreadable says a stored revision or object is not what
	// poolplanner writes: damaged, or written by another program.
	ErrUnreadable = errors.New("unreadable")
)

// codeErr is the error kind of a wire code.
func codeErr(code string) error {
	switch code {
	case wire.CodeBadRequest:
		return ErrBadRequest
	case wire.CodeNotFound:
		return ErrNotFound
	case wire.CodeInfeasible:
		return ErrInfeasible
	}
	return ErrInternal
}

// PlacedWorker is a Worker with what a launcher needs to start it.
type PlacedWorker struct {
	plan.Worker
	// CUDAVisibleDevices is the value for CUDA_VISIBLE_DEVICES: the GPU
	// UUIDs when known (they survive device reordering), else the
	// node-local indices; empty for a worker without GPUs.
	CUDAVisibleDevices string `json:"cuda_visible_devices"`
	// Plan and Revision say which plan revision the answer comes from.
	Plan     string `json:"plan"`
	Revision int    `json:"revision"`
}

// AppendJSON writes the worker's fields and the placement's, as
// encoding/json would: lookups are the service's hottest reply.
func (pw PlacedWorker) AppendJSON(b []byte) []byte {
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

// Assignment is one node's workers of a plan: the message on the node's
// assignment subject, and the reply to a lookup by node. Revision is the
// plan revision that last changed them.
type Assignment struct {
	Plan     string         `json:"plan"`
	Revision int            `json:"revision"`
	NodeID   string         `json:"node_id"`
	Workers  []PlacedWorker `json:"workers"`
	// Seq is the stream sequence the assignment was read at (0 when it
	// was not read from the stream).
	Seq uint64 `json:"-"`
	// Err is set by Assignments for a message it could not read (damaged,
	// or its object gone); Workers is then empty.
	Err error `json:"-"`
}

// ValidateReply is the reply to validate: the plan the spec would get on
// the live inventory, with valid and error as in the plan document.
type ValidateReply struct {
	*plan.Document
	// Nodes is how many nodes the live inventory had.
	Nodes int `json:"nodes"`
}

// MarshalJSON writes the document's fields and nodes, as encoding/json
// would were the document not its own encoder.
func (r ValidateReply) MarshalJSON() ([]byte, error) {
	var doc []byte
	if r.Document == nil {
		doc = []byte("{}")
	} else {
		var err error
		if doc, err = r.Document.MarshalJSON(); err != nil {
			return nil, err
		}
	}
	b := append(doc[:len(doc)-1:len(doc)-1], `,"nodes":`...)
	if len(doc) == 2 {
		b = append(doc[:1:1], `"nodes":`...)
	}
	b = strconv.AppendInt(b, int64(r.Nodes), 10)
	return append(b, '}'), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *ValidateReply) UnmarshalJSON(b []byte) error {
	var d plan.Document
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	var n struct {
		Nodes int `json:"nodes"`
	}
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	r.Document, r.Nodes = &d, n.Nodes
	return nil
}
