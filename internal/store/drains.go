package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/plan"
)

// Drain is one drained node or GPU as the drain bucket keeps it: what
// is out, why, until when its workers may stay, and who took it out
// when (the audit; the bucket's history keeps the records before).
type Drain struct {
	NodeID string `json:"node_id"`
	// GPU is the node-local index drained; nil: the whole node.
	GPU *int `json:"gpu,omitempty"`
	// Cause is plan.DrainOperator (planner drain) or plan.DrainFlapping
	// (the planner held out a GPU that kept turning unhealthy).
	Cause  string `json:"cause"`
	Reason string `json:"reason,omitempty"`
	// Deadline, when set, is when the workers there must have left;
	// until then they stay (and no new work comes).
	Deadline *time.Time `json:"deadline,omitempty"`
	// By is who: the credentials' role and user where known, and the
	// OS user and host the command ran as; At is when.
	By   string    `json:"by"`
	Role string    `json:"role,omitempty"`
	At   time.Time `json:"at"`
	// Undrained marks the record of an undrain (then the key is
	// deleted): the drain is no longer in force.
	Undrained bool `json:"undrained,omitempty"`
}

// Target is the drained node ("n2") or GPU ("n2:3"), as planner drain
// takes it.
func (d Drain) Target() string { return d.Plan().Target() }

// Key is the drain's key in the bucket.
func (d Drain) Key() string { return DrainKey(d.NodeID, d.GPU) }

// Plan is the drain as a plan's status names it.
func (d Drain) Plan() plan.Drain {
	return plan.Drain{NodeID: d.NodeID, GPU: d.GPU, Cause: d.Cause, Reason: d.Reason, Deadline: d.Deadline}
}

// Validate checks a drain record: a valid node id, a GPU index in
// range, a known cause, a reason of at most MaxDrainReason bytes.
func (d Drain) Validate() error {
	if err := inventory.ValidateNodeID(d.NodeID); err != nil {
		return fmt.Errorf("node_id: %w", err)
	}
	if d.GPU != nil && (*d.GPU < 0 || *d.GPU >= inventory.MaxGPUs) {
		return fmt.Errorf("gpu: %d is out of range; want 0 to %d", *d.GPU, inventory.MaxGPUs-1)
	}
	if d.Cause != plan.DrainOperator && d.Cause != plan.DrainFlapping {
		return fmt.Errorf("cause: %q is not allowed; want %s or %s", d.Cause, plan.DrainOperator, plan.DrainFlapping)
	}
	if len(d.Reason) > MaxDrainReason {
		return fmt.Errorf("reason: %d bytes; at most %d allowed", len(d.Reason), MaxDrainReason)
	}
	return nil
}

// MaxDrainReason bounds a drain's reason.
const MaxDrainReason = 512

// DrainKey is the key of node id's drain (gpu nil) or of its GPU's:
// node.NODE_ID or gpu.INDEX.NODE_ID. The first token says which, so
// that a node id with dots (a hostname) never reads as a GPU's key.
func DrainKey(node string, gpu *int) string {
	if gpu == nil {
		return "node." + node
	}
	return "gpu." + strconv.Itoa(*gpu) + "." + node
}

// ParseDrainKey reads a drain key back.
func ParseDrainKey(key string) (node string, gpu *int, err error) {
	if n, ok := strings.CutPrefix(key, "node."); ok {
		return n, nil, inventory.ValidateNodeID(n)
	}
	rest, ok := strings.CutPrefix(key, "gpu.")
	idx, n, found := strings.Cut(rest, ".")
	if !ok || !found {
		return "", nil, fmt.Errorf("drain key %q: want node.NODE_ID or gpu.INDEX.NODE_ID", key)
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i >= inventory.MaxGPUs {
		return "", nil, fmt.Errorf("drain key %q: GPU index %q; want 0 to %d", key, idx, inventory.MaxGPUs-1)
	}
	return n, &i, inventory.ValidateNodeID(n)
}

// ParseTarget reads NODE_ID or NODE_ID:GPU_INDEX, as planner drain
// takes it (a node id has no colon).
func ParseTarget(s string) (node string, gpu *int, err error) {
	node, idx, found := strings.Cut(s, ":")
	if err := inventory.ValidateNodeID(node); err != nil {
		return "", nil, fmt.Errorf("%q: %w", s, err)
	}
	if !found {
		return node, nil, nil
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i >= inventory.MaxGPUs {
		return "", nil, fmt.Errorf("%q: GPU index %q; want NODE_ID or NODE_ID:INDEX with INDEX from 0 to %d", s, idx, inventory.MaxGPUs-1)
	}
	return node, &i, nil
}

// DecodeDrain reads a drain record stored under key; the record must
// be the key's (node and GPU alike).
func DecodeDrain(key string, data []byte) (Drain, error) {
	var d Drain
	if err := json.Unmarshal(data, &d); err != nil {
		return Drain{}, fmt.Errorf("drain %s: %w", key, err)
	}
	if err := d.Validate(); err != nil {
		return Drain{}, fmt.Errorf("drain %s: %w", key, err)
	}
	if d.Key() != key {
		return Drain{}, fmt.Errorf("drain %s: the record is %s's", key, d.Key())
	}
	return d, nil
}

// DrainStore reads and writes the drain bucket.
type DrainStore struct {
	js jetstream.JetStream
	// Replicas is how many servers keep the bucket (0: one).
	Replicas int
	// NoCreate keeps the store from creating the bucket: a reader
	// (planner status, drain --list) and the drain commands find
	// ErrNoDrainBucket where no planner made it yet.
	NoCreate bool
}

// ErrNoDrainBucket is a store that may not create the drain bucket
// (NoCreate) finding none: no planner made it yet.
var ErrNoDrainBucket = errors.New("the drain bucket " + client.DrainBucket + " does not exist: no planner has run against this server (is planner serve connected to it?)")

// NewDrainStore returns a store over js.
func NewDrainStore(js jetstream.JetStream) *DrainStore { return &DrainStore{js: js} }

// KV binds the bucket, creating it if missing and the store may (an
// admin may write drains but not make the bucket, which the planner
// does at start).
func (s *DrainStore) KV(ctx context.Context) (jetstream.KeyValue, error) {
	return bindKV(ctx, s.js, client.DrainBucket, s.NoCreate, ErrNoDrainBucket, s.Ensure)
}

// Ensure creates the drain bucket, or brings its settings to
// DrainBucketConfig.
func (s *DrainStore) Ensure(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := ensureKV(ctx, s.js, bus.DrainBucketConfig(s.Replicas))
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", client.DrainBucket, bus.ReplicasErr(err, s.Replicas))
	}
	return kv, nil
}

// Put stores d (checked) as its key's drain.
func (s *DrainStore) Put(ctx context.Context, d Drain) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: drain %s: %w", client.ErrBadRequest, d.Target(), err)
	}
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("drain %s: %w", d.Target(), err)
	}
	kv, err := s.KV(ctx)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, d.Key(), data); err != nil {
		return fmt.Errorf("drain %s: %w", d.Target(), err)
	}
	return nil
}

// Undrain ends the drain of node (gpu nil) or its GPU: it stores who
// undrained it and when (the audit), then deletes the key. A target not
// drained is ErrNotFound.
func (s *DrainStore) Undrain(ctx context.Context, node string, gpu *int, by, role string, at time.Time) error {
	kv, err := s.KV(ctx)
	if err != nil {
		return err
	}
	key := DrainKey(node, gpu)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return fmt.Errorf("undrain %s: not drained: %w", plan.Drain{NodeID: node, GPU: gpu}.Target(), client.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("undrain %s: %w", key, err)
	}
	d, err := DecodeDrain(key, e.Value())
	if err != nil {
		d = Drain{NodeID: node, GPU: gpu, Cause: plan.DrainOperator}
	}
	d.Undrained, d.By, d.Role, d.At = true, by, role, at.UTC()
	data, _ := json.Marshal(d) // plain data
	if _, err := kv.Update(ctx, key, data, e.Revision()); err != nil {
		return fmt.Errorf("undrain %s: %w", d.Target(), err)
	}
	if err := kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("undrain %s: %w", d.Target(), err)
	}
	return nil
}

// List returns the drains in force, by key; a record that does not
// decode is skipped and reported in bad. It reads by direct gets of the
// keys the stream's subjects name (bucketKeys), no consumer: clients
// may make none on the drain bucket (auth's plannerOnlyConsumers).
func (s *DrainStore) List(ctx context.Context) (drains []Drain, bad []error, err error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return nil, nil, err
	}
	keys, err := bucketKeys(ctx, s.js, client.DrainBucket)
	if err != nil {
		return nil, nil, fmt.Errorf("list drains: %w", err)
	}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // undrained
		}
		if err != nil {
			return nil, nil, fmt.Errorf("get drain %s: %w", k, err)
		}
		d, err := DecodeDrain(k, e.Value())
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if !d.Undrained {
			drains = append(drains, d)
		}
	}
	slices.SortFunc(drains, func(a, b Drain) int { return strings.Compare(a.Key(), b.Key()) })
	return drains, bad, nil
}
