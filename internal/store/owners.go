package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// MaxOwnedPerNode bounds one node's record: a reporter inventing new
// UUIDs at every put must not grow it for ever. Past it the record keeps
// the UUIDs it has (the first ones the node held).
const MaxOwnedPerNode = 1024

// OwnerRecord is one node's record in bus.OwnersBucket.
type OwnerRecord struct {
	NodeID string `json:"node_id"`
	// GPUUUIDs are the UUIDs the node held first (as far as the
	// planners' memory goes back), sorted.
	GPUUUIDs []string `json:"gpu_uuids"`
	// Since is when the record was made.
	Since time.Time `json:"since"`
	// Added is when each UUID joined the record (one missing: Since, as
	// records written before Added have it): of two records naming one
	// UUID (planners that disagreed), the node that was recorded with it
	// first owns it. Not the older record's: a UUID added later to an
	// old record must not win over the node recorded with it before.
	Added map[string]time.Time `json:"added,omitempty"`
}

// addedAt is when u joined r.
func (r *OwnerRecord) addedAt(u string) time.Time {
	if t, ok := r.Added[u]; ok {
		return t
	}
	return r.Since
}

// OwnerStore reads and writes bus.OwnersBucket.
type OwnerStore struct {
	js jetstream.JetStream
	// Replicas is how many servers keep the bucket (0: one).
	Replicas int
}

// NewOwnerStore returns a store over js.
func NewOwnerStore(js jetstream.JetStream) *OwnerStore { return &OwnerStore{js: js} }

// Ensure creates the bucket if it is missing.
func (s *OwnerStore) Ensure(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := ensureKV(ctx, s.js, jetstream.KeyValueConfig{
		Bucket:      bus.OwnersBucket,
		Description: "poolplanner GPU UUID owners, key = node id",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(s.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", bus.OwnersBucket, err)
	}
	return kv, nil
}

// Load reads every record and returns each UUID's owner. Keys come from
// the stream's subjects and values from batched direct gets (key by key,
// listWindow at a time, on a server that does not batch), as List reads
// the inventory: no consumer, and 20 round trips at 20,000 nodes.
func (s *OwnerStore) Load(ctx context.Context) (map[string]string, error) {
	kv, err := s.js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return nil, fmt.Errorf("read GPU UUID owners: %w", err)
	}
	ids, err := bucketKeys(ctx, s.js, bus.OwnersBucket)
	if err != nil {
		return nil, fmt.Errorf("read GPU UUID owners: %w", err)
	}
	recs, err := s.loadBatched(ctx, ids)
	if errors.Is(err, errNoMultiLast) {
		recs, err = loadEach(ctx, kv, ids)
	}
	if err != nil {
		return nil, err
	}
	return ownersOf(recs), nil
}

// loadBatched is Load's records in batched direct gets.
func (s *OwnerStore) loadBatched(ctx context.Context, ids []string) ([]OwnerRecord, error) {
	byID, err := bucketValues(ctx, s.js, bus.OwnersBucket, "KV_"+bus.OwnersBucket, ids)
	if err != nil {
		return nil, fmt.Errorf("read GPU UUID owners: %w", err)
	}
	recs := make([]OwnerRecord, 0, len(byID))
	for _, id := range ids {
		v, ok := byID[id]
		if !ok {
			continue
		}
		rec, err := decodeOwners(id, v.Data, v.Seq)
		if err != nil {
			return nil, fmt.Errorf("read GPU UUID owners of node %s: %w", id, err)
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// loadEach is Load's records key by key, listWindow at a time.
func loadEach(ctx context.Context, kv jetstream.KeyValue, ids []string) ([]OwnerRecord, error) {
	recs := make([]OwnerRecord, len(ids))
	errs := make([]error, len(ids))
	slots := make(chan struct{}, listWindow)
	var wg sync.WaitGroup
	for i, id := range ids {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nil, fmt.Errorf("read GPU UUID owners: %w", ctx.Err())
		}
		wg.Go(func() {
			defer func() { <-slots }()
			rec, _, err := getOwners(ctx, kv, id)
			if err != nil {
				errs[i] = err
				return
			}
			recs[i] = rec
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("read GPU UUID owners of node %s: %w", ids[i], err)
		}
	}
	return recs, nil
}

// ownersOf is each UUID's owner by recs: the node recorded with it
// first (ties: the lower node id).
func ownersOf(recs []OwnerRecord) map[string]string {
	type claim struct {
		node string
		at   time.Time
	}
	first := map[string]claim{}
	for i := range recs {
		r := &recs[i]
		for _, u := range r.GPUUUIDs {
			if u == "" {
				continue
			}
			c := claim{r.NodeID, r.addedAt(u)}
			if old, ok := first[u]; !ok || cmp.Or(c.at.Compare(old.at), cmp.Compare(c.node, old.node)) < 0 {
				first[u] = c
			}
		}
	}
	owners := make(map[string]string, len(first))
	for u, c := range first {
		owners[u] = c.node
	}
	return owners
}

// getOwners is node's record and its revision; a zero record (revision
// 0) when there is none. A record that does not decode is an error
// naming it: the planner says it rather than forget whose GPUs they
// are.
func getOwners(ctx context.Context, kv jetstream.KeyValue, node string) (OwnerRecord, uint64, error) {
	e, err := kv.Get(ctx, node)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return OwnerRecord{NodeID: node}, 0, nil
	}
	if err != nil {
		return OwnerRecord{}, 0, err
	}
	rec, err := decodeOwners(node, e.Value(), e.Revision())
	if err != nil {
		return OwnerRecord{}, 0, err
	}
	return rec, e.Revision(), nil
}

// decodeOwners is node's record from data, stored at revision rev.
func decodeOwners(node string, data []byte, rev uint64) (OwnerRecord, error) {
	var rec OwnerRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return OwnerRecord{}, fmt.Errorf("record at revision %d does not decode: %w", rev, err)
	}
	if rec.NodeID != node {
		return OwnerRecord{}, fmt.Errorf("record at revision %d names node %q", rev, rec.NodeID)
	}
	return rec, nil
}

// Add records uuids as node's (those its record lacks), made at now if
// it has none: a read, and a write only if the record grows, checked
// against the revision read, so that two writers add to it rather than
// replace each other's.
func (s *OwnerStore) Add(ctx context.Context, node string, uuids []string, now time.Time) error {
	kv, err := s.js.KeyValue(ctx, bus.OwnersBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = s.Ensure(ctx) // lost with its server: made again
	}
	if err != nil {
		return fmt.Errorf("record GPU UUID owners of node %s: %w", node, err)
	}
	// Most records are made once, by the first planner to see the node:
	// made at once, one round trip; one that exists is read and grown.
	fresh := OwnerRecord{NodeID: node, Since: now.UTC()}
	for _, u := range uuids {
		if len(fresh.GPUUUIDs) < MaxOwnedPerNode && u != "" && !slices.Contains(fresh.GPUUUIDs, u) {
			fresh.GPUUUIDs = append(fresh.GPUUUIDs, u)
		}
	}
	if len(fresh.GPUUUIDs) == 0 {
		return nil
	}
	slices.Sort(fresh.GPUUUIDs)
	data, _ := json.Marshal(fresh)
	if _, err := kv.Create(ctx, node, data); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("record GPU UUID owners of node %s: %w", node, err)
	}
	for try := 0; ; try++ {
		rec, rev, err := getOwners(ctx, kv, node)
		if err != nil {
			return fmt.Errorf("record GPU UUID owners of node %s: %w", node, err)
		}
		if rec.Since.IsZero() {
			rec.Since = now.UTC()
		}
		merged := slices.Clone(rec.GPUUUIDs)
		added := map[string]time.Time{}
		for _, u := range uuids {
			if len(merged) >= MaxOwnedPerNode {
				break
			}
			if u != "" && !slices.Contains(merged, u) {
				merged = append(merged, u)
				added[u] = now.UTC()
			}
		}
		if len(merged) == len(rec.GPUUUIDs) {
			return nil
		}
		slices.Sort(merged)
		rec.GPUUUIDs = merged
		if len(rec.GPUUUIDs) > len(added) || rec.Added != nil {
			// Not every UUID joined now: say when these did.
			if rec.Added == nil {
				rec.Added = map[string]time.Time{}
			}
			maps.Copy(rec.Added, added)
		}
		data, _ := json.Marshal(rec)
		if rev == 0 {
			_, err = kv.Create(ctx, node, data)
		} else {
			_, err = kv.Update(ctx, node, data, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !bus.IsWrongLast(err) || try >= 16 {
			return fmt.Errorf("record GPU UUID owners of node %s: %w", node, err)
		}
	}
}
