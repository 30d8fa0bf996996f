package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/testcluster"
)

// TestReplicatedState: on three clustered embedded servers the streams
// and buckets are made with three replicas (and brought up from one),
// and a key survives the loss of the server its client talked to.
func TestReplicatedState(t *testing.T) {
	c := testcluster.Start(t, 3, nil)
	nc, err := bus.Connect(c.URLs(), "test", zerolog.Nop(), bus.Security{}, nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()

	// A bucket made with one replica is brought to three.
	inv := store.NewInventoryStore(js)
	if _, err := inv.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	inv.Replicas = 3
	if _, err := inv.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	plans := store.NewPlanStore(js)
	plans.Replicas = 3
	if err := plans.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{bus.InventoryStream, client.PlansStream, "OBJ_poolplanner-plans"} {
		st, err := js.Stream(ctx, name)
		if err != nil || st.CachedInfo().Config.Replicas != 3 {
			t.Fatalf("%s: %v, replicas %d", name, err, st.CachedInfo().Config.Replicas)
		}
	}
	doc := []byte(`{"node_id":"n1","ip":"10.0.0.1","cpus":8,"gpus":[]}`)
	if _, err := inv.Put(ctx, "n1", doc, false, time.Hour); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitCurrent(ctx, t, js, bus.InventoryStream)
	// The server this client is on goes; the client moves on, the key
	// stays, writes go on.
	c.StopServer(c.Index(nc.ConnectedUrl()))
	var werr error
	waited := false
	defer func() { // also as WaitFor fails the test
		if !waited {
			t.Logf("the last write: %v (connected %v to %s)\n%s", werr, nc.IsConnected(), nc.ConnectedUrl(), c.State())
		}
	}()
	deadline, _ := ctx.Deadline()
	natstest.WaitFor(t, time.Until(deadline), "a write after a server was lost", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		_, werr = inv.Put(pctx, "n2", doc, false, time.Hour)
		return werr == nil
	})
	waited = true
	if _, _, err := inv.Get(ctx, "n1"); err != nil {
		t.Errorf("n1 after a server was lost: %v", err)
	}
}

// TestReplicasTooMany: three replicas on one server is a setting to
// change, said so, not an outage to wait out.
func TestReplicasTooMany(t *testing.T) {
	ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	plans := store.NewPlanStore(js)
	plans.Replicas = 3
	err = plans.Ensure(context.Background())
	if !errors.Is(err, bus.ErrReplicas) {
		t.Fatalf("three replicas on one server: %v", err)
	}
}

// TestConcurrentEnsure: three planners making the streams and buckets
// at once, each on its own server of a new cluster, all succeed on
// their first call. They used to wait out their deadline and fail: a
// create-or-update updated first, an update of a stream another planner
// had just made dropped its preferred leader, and the cluster answered
// no one until its replicas elected a leader by timeout; a request whose
// answer is lost is now asked again (bus.CreateOrUpdate, bus.RetryLost).
func TestConcurrentEnsure(t *testing.T) {
	c := testcluster.Start(t, 3, nil)
	errs := make(chan error, 3)
	for i := range 3 {
		nc, err := bus.Connect(c.URL(i), "test", zerolog.Nop(), bus.Security{})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		go func() {
			// Long enough for any loaded machine: a lost answer waited on
			// would still fail it.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			plans, specs, inv, drains, owners := store.NewPlanStore(js), store.NewSpecStore(js), store.NewInventoryStore(js), store.NewDrainStore(js), store.NewOwnerStore(js)
			plans.Replicas, specs.Replicas, inv.Replicas, drains.Replicas, owners.Replicas = 3, 3, 3, 3, 3
			err := plans.Ensure(ctx)
			for _, ensure := range []func(context.Context) (jetstream.KeyValue, error){specs.Ensure, inv.Ensure, drains.Ensure, owners.Ensure} {
				if err == nil {
					_, err = ensure(ctx)
				}
			}
			errs <- err
		}()
	}
	for i := range 3 {
		if err := <-errs; err != nil {
			t.Errorf("planner %d of 3 making the streams and buckets: %v", i+1, err)
		}
	}
}
