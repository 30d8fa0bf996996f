// Package bus is poolplanner's NATS plumbing: connecting with reconnects,
// an embedded server and its data directory, payload limits, the
// settings of the streams and buckets, the lease message, and the micro
// service that answers through handlers. What is stored in them, and the
// policy over it, is package store's and the service's.
package bus

import "github.com/poolplanner/poolplanner/client"

// Names of our own, documented in subjects.md.
const (
	// InventoryStream is the stream behind client.InventoryBucket, as
	// JetStream names KV streams.
	InventoryStream = "KV_" + client.InventoryBucket
	// InventorySubjectPrefix prefixes the subject of a node's key.
	InventorySubjectPrefix = "$KV." + client.InventoryBucket + "."
	// HeartbeatHeader is set ("1") on a put that only refreshes a key's
	// TTL: its value is byte-for-byte the previous put's. A put without it
	// is a change.
	HeartbeatHeader = "Poolplanner-Heartbeat"
)

// InventorySubject is the subject a node's inventory key is stored under.
func InventorySubject(nodeID string) string {
	return InventorySubjectPrefix + nodeID
}
