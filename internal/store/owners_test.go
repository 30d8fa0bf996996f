package store

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestOwnerStore: records grow, never shrink; a UUID two records name
// is the node's recorded with it first (not the older record's: u2
// joined a's record after b's was made with it); writers at once add to a record rather
// than replace each other's; a record is bounded; one that does not
// decode is an error naming its node.
func TestOwnerStore(t *testing.T) {
	t.Parallel()
	js := natstest.Start(t).JS(t)
	ctx := context.Background()
	s := NewOwnerStore(js)
	kv, err := s.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		node  string
		uuids []string
		at    time.Time
	}{
		{"a", []string{"u0", "u1"}, t0},
		{"a", []string{"u1", "u2"}, t0.Add(time.Hour)}, // grows; u2 joins at its own time
		{"b", []string{"u2", "u3"}, t0.Add(time.Minute)},
		{"a", []string{"u0"}, t0.Add(2 * time.Hour)}, // nothing new: no write
	} {
		if err := s.Add(ctx, c.node, c.uuids, c.at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"u0": "a", "u1": "a", "u2": "b", "u3": "b"}
	if !maps.Equal(got, want) {
		t.Errorf("owners %v, want %v", got, want)
	}
	// Key by key (a server that does not batch) reads the same.
	ids, err := bucketKeys(ctx, js, bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := loadEach(ctx, kv, ids); err != nil || !maps.Equal(ownersOf(recs), want) {
		t.Errorf("read key by key: %v, %v; want %v", ownersOf(recs), err, want)
	}
	if e, _ := kv.Get(ctx, "a"); e.Revision() != 2 {
		t.Errorf("a's record at revision %d, want 2 (an add of nothing new writes nothing)", e.Revision())
	}

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := s.Add(ctx, "c", []string{fmt.Sprintf("c%d", i)}, t0); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	rec, _, _ := getOwners(ctx, kv, "c")
	if len(rec.GPUUUIDs) != 8 {
		t.Errorf("8 writers at once left %v", rec.GPUUUIDs)
	}

	many := make([]string, MaxOwnedPerNode+10)
	for i := range many {
		many[i] = fmt.Sprintf("m%05d", i)
	}
	if err := s.Add(ctx, "rogue", many, t0); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := getOwners(ctx, kv, "rogue"); len(rec.GPUUUIDs) != MaxOwnedPerNode {
		t.Errorf("a record of %d UUIDs, want the bound %d", len(rec.GPUUUIDs), MaxOwnedPerNode)
	}

	if _, err := kv.Put(ctx, "d", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx); err == nil || !strings.Contains(err.Error(), "node d") {
		t.Errorf("a record that does not decode: %v, want an error naming node d", err)
	}
}

// TestOwnersOf: each UUID is the node's recorded with it first, by the
// time it joined its record (Added), else the record's Since (records
// written before Added); ties go to the lower node id.
func TestOwnersOf(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		recs []OwnerRecord
		want map[string]string
	}{
		{"older record, no added times", []OwnerRecord{
			{NodeID: "x", GPUUUIDs: []string{"u1"}, Since: t0.Add(time.Minute)},
			{NodeID: "y", GPUUUIDs: []string{"u1"}, Since: t0},
		}, map[string]string{"u1": "y"}},
		{"added later to an older record loses", []OwnerRecord{
			{NodeID: "x", GPUUUIDs: []string{"u0", "u1"}, Since: t0, Added: map[string]time.Time{"u1": t0.Add(time.Hour)}},
			{NodeID: "y", GPUUUIDs: []string{"u1"}, Since: t0.Add(time.Minute)},
		}, map[string]string{"u0": "x", "u1": "y"}},
		{"tie to the lower node id", []OwnerRecord{
			{NodeID: "z", GPUUUIDs: []string{"u1"}, Since: t0},
			{NodeID: "b", GPUUUIDs: []string{"u1"}, Since: t0},
		}, map[string]string{"u1": "b"}},
		{"empty UUIDs ignored", []OwnerRecord{{NodeID: "x", GPUUUIDs: []string{""}, Since: t0}}, map[string]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ownersOf(c.recs); !maps.Equal(got, c.want) {
				t.Errorf("owners %v, want %v", got, c.want)
			}
		})
	}
}
