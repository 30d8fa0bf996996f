package bus

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/internal/wire"
)

// BodyLimit is the largest body poolplanner puts in one message on nc:
// under 1 MB (NATS's default max_payload, wire.MaxMessage), or under
// the server's max_payload where that is smaller, leaving room for
// headers. Larger bodies go into objects that messages point at.
func BodyLimit(nc *nats.Conn) int {
	limit := int64(wire.MaxMessage)
	if max := nc.MaxPayload(); max > 0 && max < limit {
		limit = max
	}
	return int(limit) - headerRoom
}

// headerRoom is what BodyLimit leaves for a message's headers (a
// reason and an error of at most 1 KiB each, and NATS's own).
const headerRoom = 16 << 10

// CheckPayload refuses a body the server will not take, with a message
// that says so, instead of NATS's bare "maximum payload exceeded".
func CheckPayload(nc *nats.Conn, what string, size int) error {
	if max := nc.MaxPayload(); max > 0 && int64(size) > max {
		return fmt.Errorf("%s is %d bytes, over the server's max_payload of %d", what, size, max)
	}
	return nil
}
