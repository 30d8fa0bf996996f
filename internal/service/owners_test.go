package service

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// smallSpec fits one node of 8 GPUs, so that no revision places a
// worker on the second.
const smallSpec = `
scheduling:
  train: {worker_num: 2, num_cpus: 1, num_gpus: 1}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// TestSquatterLosesToOwnerAcrossPlanners: node r2 reports (no revision
// places a worker there) and leaves; while it is away a rogue reporter
// of node rg puts r2's document (r2's UUIDs). A planner started then
// (after a restart, or as a standby) knows from the owners the leader
// persisted that they are r2's: when r2 returns it gets its GPUs back,
// rg's copies are refused naming r2, and the conflict is a problem
// naming both nodes. Without the persisted owners the fresh planner
// takes rg, the first holder it saw, for the owner, and refuses r2.
func TestSquatterLosesToOwnerAcrossPlanners(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		standby bool // the fresh planner starts as a standby, the first one leading
	}{
		{name: "restart"},
		{name: "standby", standby: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()
			url := h.nc.ConnectedUrl()
			cfg := Config{Spec: []byte(smallSpec), Debounce: 20 * time.Millisecond, Settle: -1, LeaseTTL: time.Second}
			first := h.instance(url, cfg)
			invs := store.NewInventoryStore(h.js)
			put := func(id string, doc inventory.NodeInventory) {
				t.Helper()
				data, _ := json.Marshal(doc)
				if _, err := invs.Put(ctx, id, data, false, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			sees := func(in *instance, id string) func() bool {
				return func() bool {
					return slices.ContainsFunc(in.p.Inventory(), func(n inventory.NodeInventory) bool { return n.NodeID == id })
				}
			}
			put("r1", claimant("r1", nil))
			h.waitRevision(1)
			put("r2", claimant("r2", nil))
			natstest.WaitFor(t, 10*time.Second, "the leader seeing r2", sees(first, "r2"))
			r2 := inventory.SimulatedUUID("r2", 0)
			owners := store.NewOwnerStore(h.js)
			natstest.WaitFor(t, 10*time.Second, "r2's GPUs recorded as r2's", func() bool {
				o, err := owners.Load(ctx)
				return err == nil && o[r2] == "r2" && o[inventory.SimulatedUUID("r2", 7)] == "r2"
			})
			for _, pl := range first.p.Plans() {
				for _, w := range pl.Workers.All() {
					if w.NodeID == "r2" {
						t.Fatalf("revision %d places %s %d on r2: the plan would say whose GPUs they are", pl.Revision, w.Component, w.Index)
					}
				}
			}

			if err := invs.Delete(ctx, "r2", time.Minute); err != nil {
				t.Fatal(err)
			}
			steal := map[int]string{}
			for g := range 8 {
				steal[g] = fmt.Sprintf("r2:%d", g)
			}
			put("rg", claimant("rg", steal))
			natstest.WaitFor(t, 10*time.Second, "the leader seeing rg", sees(first, "rg"))
			if !c.standby {
				first.stop()
			}
			fresh := h.instance(url, cfg)
			natstest.WaitFor(t, 10*time.Second, "the fresh planner seeing rg", sees(fresh, "rg"))
			if docs := fresh.p.Inventory(); !slices.ContainsFunc(docs, func(n inventory.NodeInventory) bool {
				return n.NodeID == "rg" && n.GPUs[0].Healthy
			}) {
				t.Fatalf("the squatter's GPUs refused before r2 is back: %+v", docs)
			}

			put("r2", claimant("r2", nil))
			planners := []*instance{fresh}
			if c.standby {
				planners = append(planners, first)
			}
			for i, in := range planners {
				natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("planner %d: r2's GPUs healthy, rg's refused naming r2, a problem naming both", i), func() bool {
					docs := in.p.Inventory()
					var okR2, okRG bool
					for _, d := range docs {
						switch d.NodeID {
						case "r2":
							okR2 = !slices.ContainsFunc(d.GPUs, func(g inventory.GPU) bool { return !g.Healthy })
						case "rg":
							okRG = !slices.ContainsFunc(d.GPUs, func(g inventory.GPU) bool {
								return g.Healthy || !strings.Contains(g.UnhealthyReason, "held by node r2")
							})
						}
					}
					said := slices.ContainsFunc(in.p.Health().Problems, func(s string) bool {
						return strings.Contains(s, "GPU UUID conflict") && strings.Contains(s, "held by node r2") && strings.Contains(s, "listed by node rg")
					})
					return okR2 && okRG && said
				})
			}
		})
	}
}

// flakyOwners is an owners bucket whose first fail reads fail.
type flakyOwners struct {
	fail, reads int
	owners      map[string]string
}

func (f *flakyOwners) Load(context.Context) (map[string]string, error) {
	f.reads++
	if f.reads <= f.fail {
		return nil, fmt.Errorf("read %d: %w", f.reads, context.DeadlineExceeded)
	}
	return f.owners, nil
}

func (f *flakyOwners) Ensure(context.Context) error { return nil }

func (f *flakyOwners) Add(context.Context, string, []string, time.Time) error { return nil }

// TestOwnersReadAgain: a planner that could not read the owners at start
// says so as a problem, and what a later read brings (reread, off the
// loop) the loop takes at its next guard round: it then goes by them and
// the problem clears, rather than going without them until a restart;
// what it inferred meanwhile it neither records nor keeps over the
// records. The loop never waits on the store for it.
func TestOwnersReadAgain(t *testing.T) {
	p := drive(New(Config{StoreTimeout: time.Second}))
	st := &flakyOwners{fail: 2, owners: map[string]string{"GPU-r2-0": "r2"}}
	p.ownerStore = st
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	problem := func() bool { _, ok := p.health.problems["owners:read"]; return ok }
	p.loadOwners(ctx) // read 1 fails; the reread waits ownersRetry on the system clock
	if !problem() || p.live.claims.Owner("GPU-r2-0") != "" || !p.owners.unread {
		t.Fatalf("after a failed read: problem %v, owner %q", problem(), p.live.claims.Owner("GPU-r2-0"))
	}
	// What it infers meanwhile (a squatter seen first) it does not
	// record, leading or not: the records may say otherwise.
	p.live.claims.Own("GPU-r2-0", "rg")
	p.fence.seq.Store(1)
	p.saveOwners()
	if len(p.owners.saves) != 0 {
		t.Fatalf("recorded %v before the owners were read", <-p.owners.saves)
	}
	// The reread's tries, by hand (its timer is ownersRetry): one fails,
	// nothing for the loop; the next reads.
	if _, ok := p.owners.tryLoad(ctx, zerolog.Nop(), time.Second); ok {
		t.Fatal("read 2 should fail")
	}
	p.retryOwners()
	if !problem() || p.live.claims.Owner("GPU-r2-0") != "rg" {
		t.Fatalf("nothing read yet: problem %v, owner %q", problem(), p.live.claims.Owner("GPU-r2-0"))
	}
	owners, ok := p.owners.tryLoad(ctx, zerolog.Nop(), time.Second)
	if !ok {
		t.Fatal("read 3 should succeed")
	}
	p.owners.loaded <- owners
	p.retryOwners()
	if problem() || p.live.claims.Owner("GPU-r2-0") != "r2" || p.owners.unread {
		t.Fatalf("after the read: problem %v, owner %q (want r2)", problem(), p.live.claims.Owner("GPU-r2-0"))
	}
	p.saveOwners()
	if len(p.owners.saves) != 0 {
		t.Fatalf("recorded %v, the squatter's inference the records overrode", <-p.owners.saves)
	}
	if st.reads != 3 {
		t.Errorf("%d reads, want 3", st.reads)
	}
}

// TestOwnersBucketLostRefilled: the owners bucket deleted under a
// leading planner is made again at its next guard round and refilled
// with every owner it knows, not only those it learns from then on: a
// planner started later still knows whose GPUs they are.
func TestOwnersBucketLostRefilled(t *testing.T) {
	t.Parallel()
	r := newRide(t, 4, Config{Spec: []byte(smallSpec), Debounce: 50 * time.Millisecond, Settle: -1, LeaseTTL: time.Second})
	r.waitPlan(20*time.Second, "revision 1", revisionAtLeast(1))
	st := store.NewOwnerStore(r.js)
	var before map[string]string
	natstest.WaitFor(t, 20*time.Second, "the owners of the 4 nodes' 32 GPUs recorded", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		before, _ = st.Load(ctx)
		return len(before) == 32
	})
	if err := r.js.DeleteKeyValue(context.Background(), bus.OwnersBucket); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 20*time.Second, "the owners bucket made again with every owner", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		after, err := st.Load(ctx)
		return err == nil && maps.Equal(after, before)
	})
}

// missingOwners is an owners bucket that a server does not know of for
// its first missing reads (a cluster still forming after Ensure made it).
type missingOwners struct {
	missing, reads, ensures int
	owners                  map[string]string
}

func (m *missingOwners) Load(context.Context) (map[string]string, error) {
	m.reads++
	if m.reads <= m.missing {
		return nil, fmt.Errorf("read GPU UUID owners: %w", jetstream.ErrBucketNotFound)
	}
	return m.owners, nil
}

func (m *missingOwners) Ensure(context.Context) error { m.ensures++; return nil }

func (m *missingOwners) Add(context.Context, string, []string, time.Time) error { return nil }

// TestOwnersBucketNotKnownYet: at start, an owners bucket a server says
// is not there (made a moment ago on a cluster still forming: CI saw it
// in TestHAStartQuiet) is made again and read again, quietly, rather
// than said as a problem; one that stays unread is said as before.
func TestOwnersBucketNotKnownYet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing int
		problem bool
	}{
		{"known at the third read", 2, false},
		{"never known", 1000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := drive(New(Config{StoreTimeout: time.Second}))
			st := &missingOwners{missing: tc.missing, owners: map[string]string{"GPU-r2-0": "r2"}}
			p.ownerStore = st
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p.loadOwners(ctx)
			_, problem := p.health.problems["owners:read"]
			if problem != tc.problem || p.owners.unread != tc.problem {
				t.Fatalf("problem %v unread %v, want %v", problem, p.owners.unread, tc.problem)
			}
			if !tc.problem && (p.live.claims.Owner("GPU-r2-0") != "r2" || st.reads != 3 || st.ensures != 2) {
				t.Fatalf("owner %q after %d reads and %d ensures, want r2, 3 and 2", p.live.claims.Owner("GPU-r2-0"), st.reads, st.ensures)
			}
		})
	}
}
