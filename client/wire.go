package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go"

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
)

// ErrUnreadable says a stored revision or object is not what poolplanner
// writes: damaged, or written by another program.
var ErrUnreadable = errors.New("unreadable")

// Wire codes of the error kinds, sent in micro's Nats-Service-Error-Code.
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeInfeasible = "422"
	CodeInternal   = "500"
)

// CodeErr is the error kind of a wire code.
func CodeErr(code string) error {
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

// PlanRequest asks for plan Plan, its latest revision or Revision.
type PlanRequest struct {
	Plan     string `json:"plan"`
	Revision int    `json:"revision,omitempty"`
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

// Place returns w of plan name's revision rev with its
// CUDA_VISIBLE_DEVICES value.
func Place(name string, rev int, w plan.Worker) PlacedWorker {
	pw := PlacedWorker{Worker: w, Plan: name, Revision: rev}
	switch {
	case len(w.GPUUUIDs) == len(w.GPUs) && len(w.GPUs) > 0:
		pw.CUDAVisibleDevices = strings.Join(w.GPUUUIDs, ",")
	case len(w.GPUs) > 0:
		s := make([]string, len(w.GPUs))
		for i, g := range w.GPUs {
			s[i] = strconv.Itoa(g)
		}
		pw.CUDAVisibleDevices = strings.Join(s, ",")
	}
	return pw
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

// ObjectRef is the body of a reply or an assignment too large for one
// message (ObjectHeader set): the object that holds it, in Bucket.
type ObjectRef struct {
	Bucket string `json:"bucket"`
	Object string `json:"object"`
	// Size is the object's size in bytes (gzipped JSON).
	Size uint64 `json:"size"`
}

// compressAbove is the body size past which bodies are gzipped.
const compressAbove = 256 << 10

// MaxDecoded bounds what a gzipped message body may expand to: a
// message of MaxMessage bytes of plan JSON expands about 25 times.
const MaxDecoded = 64 << 20

// Encode marshals v for the bus: plain JSON, or gzipped JSON with
// EncodingHeader set when it is large. The header is nil for plain JSON.
func Encode(v any) ([]byte, nats.Header, error) {
	var data []byte
	switch x := v.(type) {
	case *plan.Document:
		data = x.AppendJSON(nil)
	case PlacedWorker:
		data = x.AppendJSON(make([]byte, 0, 512))
	default:
		var err error
		if data, err = json.Marshal(v); err != nil {
			return nil, nil, err
		}
	}
	if len(data) <= compressAbove {
		return data, nil, nil
	}
	z, err := Gzip(data)
	if err != nil {
		return nil, nil, err
	}
	return z, nats.Header{EncodingHeader: []string{EncodingGzip}}, nil
}

// Gzip compresses data. (klauspost's gzip writes the standard format at
// twice the speed.)
func Gzip(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Decode reads a body Encode wrote into v, expanding a gzipped one to at
// most MaxDecoded bytes.
func Decode(data []byte, h nats.Header, v any) error {
	switch enc := h.Get(EncodingHeader); enc {
	case "":
	case EncodingGzip:
		var err error
		if data, err = Gunzip(data, MaxDecoded); err != nil {
			return err
		}
	default:
		return fmt.Errorf("body encoded as %q; this client reads plain or gzip", enc)
	}
	return json.Unmarshal(data, v)
}

// Gunzip expands data, refusing more than limit bytes.
func Gunzip(data []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("gzipped body: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, fmt.Errorf("gzipped body: %w", err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("gzipped body expands past %d bytes", limit)
	}
	return out, nil
}
