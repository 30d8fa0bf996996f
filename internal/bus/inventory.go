package bus

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Inventory bucket settings. Reporters and the planner both create the
// bucket if it is missing, so they must agree on every setting: a
// create-or-update with different settings would flip the bucket's
// configuration back and forth.
const (
	// InventoryHistory is how many revisions per key are kept, for audit
	// of the last changes. Every revision carries the reporter's TTL, so
	// history never outlives the node by more than one TTL.
	InventoryHistory = 16
	// MinKeyTTL is the shortest per-key TTL the server allows, and so
	// the floor of every reporter's --ttl.
	MinKeyTTL = time.Second
)

// ExpiredHeader marks the delete marker the leading planner writes for
// a key whose TTL ran out (Tombstone), so that every watcher, `nats kv
// watch` included, sees the node go: the server writes no marker of its
// own for an expired key where rollups are refused. Its value is the
// last revision of the key the planner saw (0: not known). A watch takes
// such a marker for an expiry (ReasonExpired), not a reporter's delete.
const ExpiredHeader = "Poolplanner-Expired"

// InventoryMaxDoc bounds one inventory document: a node of 64 GPUs is
// about 30 KB of JSON.
const InventoryMaxDoc = 256 << 10

// InventoryStreamConfig is the bucket's stream: a KV bucket as nats.go
// makes one (file storage, no bucket-wide TTL, since each put carries its
// reporter's own --ttl), except that it refuses rollups and purges, and
// documents over InventoryMaxDoc. A KV bucket allows rollups, and a
// client that may publish to its own key could then purge every key with
// "Nats-Rollup: all"; poolplanner never rolls up or purges the
// inventory (a leaving node's key gets a delete marker), so the stream
// refuses both, whoever asks. The server makes markers for expired keys
// only on streams that allow rollups, so there are none: watchers note
// each key's TTL themselves (Watch).
func InventoryStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              InventoryStream,
		Description:       "poolplanner node inventories, key = node id",
		Subjects:          []string{InventorySubjectPrefix + ">"},
		MaxMsgsPerSubject: InventoryHistory,
		MaxBytes:          -1,
		MaxMsgSize:        InventoryMaxDoc,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          max(replicas, 1),
		AllowRollup:       false,
		DenyDelete:        true,
		DenyPurge:         true,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
		AllowMsgTTL:       true,
	}
}

// KeyTTL rounds ttl up to the whole seconds the server counts message
// TTLs in, and to at least MinKeyTTL, which the server would
// impose anyway.
func KeyTTL(ttl time.Duration) time.Duration {
	ttl = (ttl + time.Second - 1).Truncate(time.Second)
	return max(ttl, MinKeyTTL)
}
