// Package wire is how poolplanner's messages look on NATS beneath what a
// launcher sees: bodies (JSON, gzipped when large) and their bounds, the
// service's requests and error codes, and the names of the objects that
// hold what is too large for a message. Package client reads it and the
// service writes it; subjects.md documents it for any NATS client.
package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/plan"
)

// Headers of the body's form.
const (
	// EncodingHeader marks a gzipped JSON body (EncodingGzip).
	EncodingHeader = "Poolplanner-Encoding"
	EncodingGzip   = "gzip"
	// ObjectHeader marks a reply or assignment whose body is an ObjectRef:
	// the message itself was too large.
	ObjectHeader = "Poolplanner-Object"
)

// Wire codes of the service's error kinds (client.ErrBadRequest...), sent
// in micro's Nats-Service-Error-Code.
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeInfeasible = "422"
	CodeInternal   = "500"
)

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

// ObjectRef is the body of a reply or an assignment too large for one
// message (ObjectHeader set): the object that holds it, in Bucket.
type ObjectRef struct {
	Bucket string `json:"bucket"`
	Object string `json:"object"`
	// Size is the object's size in bytes (gzipped JSON).
	Size uint64 `json:"size"`
}

// VisibleDevices is worker w's value for CUDA_VISIBLE_DEVICES: the GPU
// UUIDs when known (they survive device reordering), else the node-local
// indices; empty for a worker without GPUs.
func VisibleDevices(w plan.Worker) string {
	switch {
	case len(w.GPUUUIDs) == len(w.GPUs) && len(w.GPUs) > 0:
		return strings.Join(w.GPUUUIDs, ",")
	case len(w.GPUs) > 0:
		s := make([]string, len(w.GPUs))
		for i, g := range w.GPUs {
			s[i] = strconv.Itoa(g)
		}
		return strings.Join(s, ",")
	}
	return ""
}

// MaxMessage bounds every message poolplanner sends: NATS's default
// max_payload, so that a stock server carries them at any cluster size.
const MaxMessage = 1 << 20

// compressAbove is the body size past which bodies are gzipped.
const compressAbove = 256 << 10

// MaxDecoded bounds what a gzipped message body may expand to: a
// message of MaxMessage bytes of plan JSON expands about 25 times.
const MaxDecoded = 64 << 20

// MaxObject bounds what a snapshot or reply object may expand to: a plan
// of 100,000 nodes and 1.8 million workers is about 400 MB of JSON.
const MaxObject = 2 << 30

// Encode marshals v for the bus: plain JSON, or gzipped JSON with
// EncodingHeader set when it is large. The header is nil for plain JSON.
// A json.RawMessage is taken as the JSON already made (the service's
// hottest replies write their own).
func Encode(v any) ([]byte, nats.Header, error) {
	var data []byte
	switch x := v.(type) {
	case *plan.Document:
		data = x.AppendJSON(nil)
	case json.RawMessage:
		data = x
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
	return DecodeWith(data, h, func(b []byte) error { return json.Unmarshal(b, v) })
}

// DecodeWith is Decode with unmarshal reading the JSON: a reader of many
// bodies of one type decodes them without reflection.
func DecodeWith(data []byte, h nats.Header, unmarshal func([]byte) error) error {
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
	return unmarshal(data)
}

// Gunzip expands data, refusing more than limit bytes.
func Gunzip(data []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("gzipped body: %w", err)
	}
	// Sized from the gzip trailer's length (mod 2^32) where it is
	// plausible, rather than grown by doubling from 512 bytes: a 70 MB
	// snapshot read that way leaves as much garbage again, while the
	// planner restarts. Capped by limit and by a ratio, so that a small
	// hostile body cannot make a large buffer by claiming a size.
	buf := bytes.NewBuffer(make([]byte, 0, gunzipHint(data, limit)))
	_, err = buf.ReadFrom(io.LimitReader(zr, limit+1))
	out := buf.Bytes()
	if err != nil {
		return nil, fmt.Errorf("gzipped body: %w", err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("gzipped body expands past %d bytes", limit)
	}
	return out, nil
}

// gunzipHint is the buffer to gunzip data into: its trailer's size (the
// last 4 bytes, little-endian, mod 2^32), unless that is past limit,
// past what an int holds (32-bit builds), or past a ratio of the body
// our documents do not reach (a plan's JSON compresses about 10:1), so
// that junk claiming a size costs little before its checksum fails;
// plus room for the read that finds the end. A body past the ratio is
// still read, by doubling.
func gunzipHint(data []byte, limit int64) int {
	const room = 512 // bytes.Buffer.ReadFrom's bytes.MinRead
	const ratio = 64
	if len(data) < 4 {
		return room
	}
	n := int64(binary.LittleEndian.Uint32(data[len(data)-4:]))
	if n > limit || n > ratio*int64(len(data)) || n > int64(math.MaxInt-room) {
		return room
	}
	return int(n) + room
}

// FollowHeartbeat is how the followers (client's Follow and FollowNode,
// the planner's inventory watch) pull: with a heartbeat every second and
// requests that expire in five, so that a follower whose consumer went
// with a server notices within two seconds and makes it again on
// another, rather than after the library's default of a minute.
func FollowHeartbeat() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullExpiry(5 * time.Second), jetstream.PullHeartbeat(time.Second)}
}
