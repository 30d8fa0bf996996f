package bus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// EncodingHeader marks a gzipped JSON body. Plans of thousands of nodes
// run to tens of MB of JSON, past NATS's default 1 MB payload; gzipped
// they shrink about 25 times. Small bodies stay plain JSON, readable by any
// NATS client as they are.
const EncodingHeader = "Poolplanner-Encoding"

// EncodingGzip is the one value EncodingHeader takes. (klauspost's gzip
// writes the same format as the standard library's, at twice the speed.)
const EncodingGzip = "gzip"

// compressAbove is the body size past which bodies are gzipped.
const compressAbove = 256 << 10

// EmbeddedMaxPayload is the embedded server's max_payload.
const EmbeddedMaxPayload = 8 << 20

// EncodeJSON marshals v for the bus: plain JSON, or gzipped JSON with
// EncodingHeader set when it is large. The header is nil for plain JSON.
func EncodeJSON(v any) ([]byte, nats.Header, error) {
	var data []byte
	// Only a bare plan takes the fast path: a reply that embeds one (the
	// validate reply) would lose its own fields.
	switch x := v.(type) {
	case *planner.Plan:
		data = x.AppendJSON(nil)
	case PlacedWorker:
		data = x.appendJSON(make([]byte, 0, 512))
	default:
		var err error
		if data, err = json.Marshal(v); err != nil {
			return nil, nil, err
		}
	}
	if len(data) <= compressAbove {
		return data, nil, nil
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if _, err := zw.Write(data); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), nats.Header{EncodingHeader: []string{EncodingGzip}}, nil
}

// DecodeJSON reads a body EncodeJSON wrote into v.
func DecodeJSON(data []byte, h nats.Header, v any) error {
	switch enc := h.Get(EncodingHeader); enc {
	case "":
	case EncodingGzip:
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("gzipped body: %w", err)
		}
		if data, err = io.ReadAll(zr); err != nil {
			return fmt.Errorf("gzipped body: %w", err)
		}
	default:
		return fmt.Errorf("body encoded as %q; this client reads plain or gzip", enc)
	}
	return json.Unmarshal(data, v)
}

// checkPayload refuses a body the server will not take, with a message
// that says what to change, instead of NATS's bare "maximum payload
// exceeded".
func checkPayload(nc *nats.Conn, what string, size int) error {
	if max := nc.MaxPayload(); max > 0 && int64(size) > max {
		return fmt.Errorf("%s is %d bytes compressed, over the server's max_payload of %d; raise max_payload (up to 64 MB) in the NATS server config", what, size, max)
	}
	return nil
}
