// Package bus is poolplanner's NATS side: the names the outside contract
// fixes, an embedded server, connecting with reconnects, and the inventory
// bucket that reporters write and the planner watches.
package bus

import (
	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/inventory"
)

// Names fixed by the outside contract (docs/contract.md), as package
// client names them.
const (
	InventoryBucket   = client.InventoryBucket
	PlansStream       = client.PlansStream
	PlanSubjectPrefix = client.PlanSubjectPrefix
	ServiceName       = client.ServiceName
	ValidateSubject   = client.ValidateSubject
	LookupSubject     = client.LookupSubject
	PlanSubject       = client.PlanSubject
)

// Headers, as package client names them.
const (
	RevisionHeader   = client.RevisionHeader
	SpecDigestHeader = client.SpecDigestHeader
	PlannerHeader    = client.PlannerHeader
	EncodingHeader   = client.EncodingHeader
	EncodingGzip     = client.EncodingGzip
)

// Names of our own, documented in subjects.md.
const (
	// InventoryStream is the stream behind InventoryBucket, as JetStream
	// names KV streams.
	InventoryStream = "KV_" + InventoryBucket
	// InventorySubjectPrefix prefixes the subject of a node's key.
	InventorySubjectPrefix = "$KV." + InventoryBucket + "."
	// HeartbeatHeader is set ("1") on a put that only refreshes a key's
	// TTL: its value is byte-for-byte the previous put's. A put without it
	// is a change.
	HeartbeatHeader = "Poolplanner-Heartbeat"
)

// PlanVersionSubject is the subject plan name's revisions are published
// on.
func PlanVersionSubject(name string) string { return client.PlanEventSubject(name) }

// InventorySubject is the subject a node's inventory key is stored under.
func InventorySubject(nodeID string) string {
	return InventorySubjectPrefix + nodeID
}

// ErrInvalidNodeID is returned for a node id that breaks
// inventory.NodeIDRule.
var ErrInvalidNodeID = inventory.ErrInvalidNodeID

// ValidateNodeID checks that id can be a key of the inventory bucket and
// the last token(s) of an assignment subject: inventory.NodeIDRule.
func ValidateNodeID(id string) error { return inventory.ValidateNodeID(id) }
