package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// Settings of the plan stream, the spec bucket and the replies bucket
// that the contract leaves to us; subjects.md documents them.
const (
	// SpecHistory is how many specs per plan name the spec bucket keeps.
	SpecHistory = 64
	// PlanDuplicateWindow is how long JetStream remembers message ids, so
	// that a retried publish of the same revision is stored once.
	PlanDuplicateWindow = 2 * time.Minute
	// RepliesTTL is how long a reply too large for a message is kept,
	// and RepliesMaxBytes how many bytes of them at most: past that, large
	// replies fail (error 500) until older ones expire, rather than fill
	// the disk. JetStream reserves a bucket's bytes on each of its
	// servers, so a server with less room gets a smaller bucket, down to
	// RepliesMinBytes.
	RepliesTTL      = 15 * time.Minute
	RepliesMaxBytes = 1 << 30
	RepliesMinBytes = 16 << 20
)

// PlansStreamConfig is the plan stream's settings: every revision kept on
// file, for audit, until the planner drops the oldest (store.PlanStore.Retain), always
// from a whole document on, so every revision kept can be rebuilt. Direct
// gets read it without consumers.
func PlansStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              client.PlansStream,
		Description:       "poolplanner plan revisions, subject = poolplanner.plans.NAME",
		Subjects:          []string{client.PlanSubjectPrefix + ">", LeaseSubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		MaxMsgsPerSubject: -1,
		Duplicates:        PlanDuplicateWindow,
		AllowDirect:       true,
		// Leases lapse by their own TTL.
		AllowMsgTTL: true,
		// Each event's headers again on poolplanner.planned.NAME, which
		// no stream stores: the planner's standbys and GPU map follow
		// there, needing no consumer, so clients holding every slot of
		// the stream's consumer cap cannot delay them.
		RePublish: &jetstream.RePublish{Source: client.PlanSubjectPrefix + ">", Destination: client.PlanRepublishPrefix + ">", HeadersOnly: true},
	}
}

// AssignmentsStreamConfig is the assignment stream's settings: the last
// message of every poolplanner.assignments.NAME.NODE_ID, so a launcher
// that starts late reads its node's workers at once.
func AssignmentsStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              client.AssignmentsStream,
		Description:       "poolplanner: each node's workers of each plan, last per subject",
		Subjects:          []string{client.AssignmentSubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		MaxMsgsPerSubject: 1,
		AllowDirect:       true,
	}
}

// SpecBucketConfig is the spec bucket's settings.
func SpecBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      client.SpecBucket,
		Description: "poolplanner job specs, key = plan name",
		History:     SpecHistory,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// DrainHistory is how many records per key the drain bucket keeps: the
// audit of who drained and undrained a node or GPU, when and why.
const DrainHistory = 64

// DrainBucketConfig is the drain bucket's settings.
func DrainBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      client.DrainBucket,
		Description: "poolplanner drained nodes and GPUs, key = node.NODE_ID or gpu.INDEX.NODE_ID",
		History:     DrainHistory,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// IsInsufficient says whether JetStream refused for want of storage:
// 10023 (insufficient resources, a cluster's placement), 10047
// (insufficient storage, one server's), or 10005 (no peers for the
// placement) when the server says the peers lacked storage.
func IsInsufficient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == 10023 || apiErr.ErrorCode == 10047 ||
		apiErr.ErrorCode == 10005 && noPeersFor(apiErr, "insufficient storage"))
}

// noPeersFor says whether a refusal for want of peers (10005) gives
// reason among its causes. The server has no code per cause: it lists
// them in the description ("no suitable peers for placement, peer
// offline, insufficient storage").
func noPeersFor(apiErr *jetstream.APIError, reason string) bool {
	_, causes, _ := strings.Cut(apiErr.Description, "no suitable peers for placement")
	return slices.Contains(strings.Split(causes, ", "), reason)
}

// ReplicasErr says, when JetStream refuses a stream for want of servers,
// how many it was asked for; a refusal for want of storage is said as
// such.
func ReplicasErr(err error, replicas int) error {
	var apiErr *jetstream.APIError
	if IsInsufficient(err) {
		return StorageErr(err, replicas, 0)
	}
	// 10005: no peers, 10074: replicas on a server that is not
	// clustered. Peers offline (a cluster still forming, a server
	// restarting) are an outage to wait out, not a setting.
	if replicas > 1 && errors.As(err, &apiErr) && (apiErr.ErrorCode == 10005 && !noPeersFor(apiErr, "peer offline") || apiErr.ErrorCode == 10074) {
		return fmt.Errorf("%w: --replicas %d: the NATS cluster has not that many JetStream servers: %w", ErrReplicas, replicas, err)
	}
	return err
}

// StorageErr says what a stream or bucket refused for want of storage
// asked for: bytes reserved (0: none, only room for what it holds) on
// each of replicas servers.
func StorageErr(err error, replicas int, bytes int64) error {
	if !IsInsufficient(err) {
		return ReplicasErr(err, replicas)
	}
	asked := "room for what it holds"
	if bytes > 0 {
		asked = fmt.Sprintf("%d MiB reserved", bytes>>20)
	}
	return fmt.Errorf("%w: it asked %s on each of %d servers, and the servers' JetStream storage (max_file_store, or the account's limit) has not that much left: %w",
		ErrStorage, asked, max(replicas, 1), err)
}

// MayBeForming says whether a refusal for want of servers (ErrReplicas)
// may be a cluster still forming: the server answers 10005 naming no
// cause both when the cluster has fewer servers than asked and when the
// servers that will make up the number have not joined it yet (a server
// that has joined and left is named: "peer offline", waited out). Only
// time tells the two apart.
func MayBeForming(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.Is(err, ErrReplicas) || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10005 {
		return false
	}
	_, causes, _ := strings.Cut(apiErr.Description, "no suitable peers for placement")
	return strings.TrimSpace(causes) == ""
}

// ErrReplicas is a stream or bucket refused for want of servers: a
// setting to change, not an outage to wait out.
var ErrReplicas = errors.New("not enough servers")

// ErrStorage is a stream or bucket refused for want of storage: a
// setting to change too.
var ErrStorage = errors.New("insufficient storage")

// StoreObject stores data gzipped in bucket as name, in chunks a message
// can carry on this server; size is the bytes stored.
func StoreObject(ctx context.Context, js jetstream.JetStream, bucket, name string, data []byte) (int, error) {
	z, err := wire.Gzip(data)
	if err != nil {
		return 0, err
	}
	return StoreGzipped(ctx, js, bucket, name, z)
}

// StoreGzipped stores z, gzipped already.
func StoreGzipped(ctx context.Context, js jetstream.JetStream, bucket, name string, z []byte) (int, error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return 0, fmt.Errorf("object store %s: %w", bucket, err)
	}
	chunk := uint32(min(objectChunk, BodyLimit(js.Conn())))
	meta := jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}
	if _, err := obs.Put(ctx, meta, bytes.NewReader(z)); err != nil {
		return 0, fmt.Errorf("store object %s/%s: %w", bucket, name, err)
	}
	return len(z), nil
}

// objectChunk is the object store's usual chunk size.
const objectChunk = 128 << 10

// StateStreams are the streams behind the planner's state, KV buckets'
// and object stores' included, in the order `planner status` lists them:
// what the service watches for loss and the status reports on.
func StateStreams() []string {
	return []string{InventoryStream, "KV_" + client.SpecBucket, "KV_" + client.DrainBucket, client.PlansStream, client.AssignmentsStream, "OBJ_" + client.PlansBucket,
		"KV_" + OwnersBucket}
}

// OwnersBucket is the KV bucket of GPU UUID owners: key = node id, value
// the UUIDs whose first holder the node was (store.OwnerRecord). The
// leading planner writes it; every planner reads it at start, so that a
// planner started while a node is away (another node listing its GPUs)
// still knows whose GPUs they are (inventory.Claims.Owned).
const OwnersBucket = "poolplanner-owners"
