package bus

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// EncodeJSON marshals v for the bus (client.Encode): plain JSON, or
// gzipped JSON with EncodingHeader set when it is large.
func EncodeJSON(v any) ([]byte, nats.Header, error) {
	if p, ok := v.(*planner.Plan); ok {
		return client.Encode(&p.Document)
	}
	return client.Encode(v)
}

// DecodeJSON reads a body EncodeJSON wrote into v, with bounded
// decompression.
func DecodeJSON(data []byte, h nats.Header, v any) error { return client.Decode(data, h, v) }

// BodyLimit is the largest body poolplanner puts in one message on nc:
// under 1 MB (NATS's default max_payload, client.MaxMessage), or under
// the server's max_payload where that is smaller, leaving room for
// headers. Larger bodies go into objects that messages point at.
func BodyLimit(nc *nats.Conn) int {
	limit := int64(client.MaxMessage)
	if max := nc.MaxPayload(); max > 0 && max < limit {
		limit = max
	}
	return int(limit) - headerRoom
}

// headerRoom is what BodyLimit leaves for a message's headers (a
// reason and an error of at most 1 KiB each, and NATS's own).
const headerRoom = 16 << 10

// checkPayload refuses a body the server will not take, with a message
// that says so, instead of NATS's bare "maximum payload exceeded".
func checkPayload(nc *nats.Conn, what string, size int) error {
	if max := nc.MaxPayload(); max > 0 && int64(size) > max {
		return fmt.Errorf("%s is %d bytes, over the server's max_payload of %d", what, size, max)
	}
	return nil
}
