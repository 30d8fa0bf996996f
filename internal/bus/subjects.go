// Package bus is poolplanner's NATS side: the names the outside contract
// fixes, an embedded server, connecting with reconnects, and the inventory
// bucket that reporters write and the planner watches.
package bus

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/poolplanner/poolplanner/client"
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

// ErrInvalidNodeID is returned for a node id that cannot be a KV key.
var ErrInvalidNodeID = errors.New("invalid node id")

var keyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

// ValidateNodeID checks that id can be a key of the inventory bucket: the
// characters JetStream KV allows, no leading or trailing dot. Hostnames
// always pass.
func ValidateNodeID(id string) error {
	if !keyRE.MatchString(id) || strings.HasPrefix(id, ".") || strings.HasSuffix(id, ".") {
		return fmt.Errorf("%w %q: use letters, digits and - _ = / . (not first or last)", ErrInvalidNodeID, id)
	}
	return nil
}
