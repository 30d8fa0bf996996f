package store

import (
	"context"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// TestBodyPendingNotReused: a PublishAssignments call that ends on its
// context leaves the body it was waiting on to nats.go, which still
// holds the message and resends it (no responders: after a pause): the
// next call must not write another node's assignment into that body, or
// the resend stores node b's workers on node a's subject. (Found in
// review: the body went to the next call's pool.)
func TestBodyPendingNotReused(t *testing.T) {
	_, js := connect(t, natstest.Start(t).URL())
	s := NewPlanStore(js)
	mk := func(node string) client.Assignment {
		a := client.Assignment{Plan: "default", Revision: 1, NodeID: node}
		w := plan.Worker{Component: plan.Env, Index: 0, NodeID: node, GPUs: []int{0}, GPUUUIDs: []string{"GPU-" + node}, GPUShare: 1}
		a.Workers = append(a.Workers, client.PlacedWorker{Worker: w, Plan: "default", Revision: 1, CUDAVisibleDevices: wire.VisibleDevices(w)})
		return a
	}
	// No stream yet: each publish gets no responders and is resent.
	for _, node := range []string{"a", "b"} {
		short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		if _, err := s.PublishAssignments(short, []client.Assignment{mk(node)}, false); err == nil {
			t.Fatalf("node %s: published with no stream", node)
		}
		cancel()
	}
	ctx := context.Background()
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(js.Conn())
	// A resend lands within nats.go's retries (2, 250 ms apart) or not
	// at all; what lands on a's subject must be a's.
	tick := time.NewTicker(natstest.Poll)
	defer tick.Stop()
	done := time.After(3 * time.Second)
	for {
		if a, err := c.Assignment(ctx, "default", "a"); err == nil && a != nil {
			if len(a.Workers) != 1 || a.Workers[0].NodeID != "a" || a.Workers[0].GPUUUIDs[0] != "GPU-a" {
				t.Fatalf("node a's subject holds %+v", a.Workers)
			}
			return
		}
		select {
		case <-tick.C:
		case <-done:
			t.Log("no resend landed on a's subject: nothing to check this run")
			return
		}
	}
}
