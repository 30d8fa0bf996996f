// Package bus is poolplanner's NATS side: the names the outside contract
// fixes, an embedded server, connecting with reconnects, and the inventory
// bucket that reporters write and the planner watches.
package bus

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Names fixed by the outside contract (shared/contract.md).
const (
	// InventoryBucket is the KV bucket of node inventories, key = node id.
	InventoryBucket = "poolplanner-inventory"
	// PlansStream is the stream of plan versions, kept for audit.
	PlansStream = "POOLPLANNER_PLANS"
	// PlanSubjectPrefix prefixes the subject of plan NAME's versions.
	PlanSubjectPrefix = "poolplanner.plans."
	// ServiceName is the micro service's name.
	ServiceName = "poolplanner"
	// ValidateSubject answers: is this job spec valid against the live
	// inventory.
	ValidateSubject = "poolplanner.validate"
	// LookupSubject answers: where does a worker (or a node's workers) go.
	LookupSubject = "poolplanner.lookup"
	// PlanSubject answers with a plan document (latest, or a revision).
	PlanSubject = "poolplanner.plan"
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

// PlanVersionSubject is the subject plan name's versions are published on.
func PlanVersionSubject(name string) string {
	return PlanSubjectPrefix + name
}

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
