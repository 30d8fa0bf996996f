package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// benchSpec fills most of 1,000 8-GPU nodes.
const benchSpec = `
scheduling:
  train:  {worker_num: 2000, num_cpus: 1, num_gpus: 1}
  eval:   {worker_num: 400, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
  env:
    - {worker_num: 8000, num_cpus: 0, num_gpus: 0.25}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`

// benchSetup starts an embedded server, n nodes in the inventory and a
// planner with no debounce, and waits for the first plan.
func benchSetup(b *testing.B, n int) (serverNC, clientNC *nats.Conn, js jetstream.JetStream, first *store.StoredPlan, follow <-chan *store.StoredPlan, stopFollow context.CancelFunc) {
	b.Helper()
	srv := natstest.Start(b)
	serverNC, clientNC = srv.Conn(b), srv.Conn(b)
	js, _ = jetstream.New(serverNC)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	invs := store.NewInventoryStore(js)
	for i := range n {
		id := fmt.Sprintf("n%04d", i)
		if _, err := invs.Put(ctx, id, simDoc(id), false, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	p := New(Config{NC: serverNC, JS: js, Spec: []byte(benchSpec), Log: zerolog.Nop()})
	go func() { _ = p.Run(ctx) }()
	plans := store.NewPlanStore(js)
	if err := plans.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	// The follower is the "decoded" subscriber; "arrived" stops it.
	fctx, stopFollow := context.WithCancel(ctx)
	var err error
	if follow, err = plans.Follow(fctx, "default", nil); err != nil {
		b.Fatal(err)
	}
	select {
	case first = <-follow:
	case <-time.After(60 * time.Second):
		b.Fatal("no first plan")
	}
	if !first.Plan.Valid() {
		b.Fatalf("first plan invalid: %s", first.Plan.Error)
	}
	return serverNC, clientNC, js, first, follow, stopFollow
}

// BenchmarkInventoryChangeToPlan is the time from an inventory change (a
// GPU of a used node turning unhealthy; another one each time) to the new
// plan reaching a subscriber, on 1,000 nodes with no debounce. "arrived"
// stops the clock when the plan message reaches a plain NATS subscriber
// on poolplanner.plans.default; "decoded" when a Go subscriber following
// the stream has decoded it.
func BenchmarkInventoryChangeToPlan(b *testing.B) {
	b.Run("arrived", func(b *testing.B) { benchChangeToPlan(b, false) })
	b.Run("decoded", func(b *testing.B) { benchChangeToPlan(b, true) })
}

func benchChangeToPlan(b *testing.B, decoded bool) {
	_, clientNC, js, first, follow, stopFollow := benchSetup(b, 1000)
	if !decoded {
		stopFollow()
		raw := make(chan *store.StoredPlan, 16)
		sub, err := clientNC.Subscribe(client.PlanEventSubject("default"), func(m *nats.Msg) {
			rev, _ := strconv.Atoi(m.Header.Get(client.RevisionHeader))
			raw <- &store.StoredPlan{Plan: &planner.Plan{Document: plan.Document{Header: plan.Header{Revision: rev}}}}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		_ = clientNC.Flush()
		follow = raw
	}
	invs := store.NewInventoryStore(js)
	// Train nodes are full, so each GPU failing there displaces a worker:
	// fail them one by one, 7 down to 0, then the next train node's.
	var victims []string
	for _, w := range first.Plan.Workers.Slice() {
		if w.Component == "train" && (len(victims) == 0 || victims[len(victims)-1] != w.NodeID) {
			victims = append(victims, w.NodeID)
		}
	}
	ctx := context.Background()
	last := first.Plan.Revision
	i := 0
	for b.Loop() {
		if i/8 >= len(victims) {
			b.Fatalf("out of train nodes to fail after %d changes", i)
		}
		victim := victims[i/8]
		sick := make([]int, 0, 8)
		for g := 7; g >= 7-i%8; g-- {
			sick = append(sick, g)
		}
		if _, err := invs.Put(ctx, victim, simDoc(victim, sick...), false, time.Hour); err != nil {
			b.Fatal(err)
		}
		i++
		for {
			select {
			case sp := <-follow:
				if sp.Plan.Revision <= last {
					continue
				}
				last = sp.Plan.Revision
			case <-time.After(30 * time.Second):
				b.Fatalf("no plan after change %d", i)
			}
			break
		}
	}
}

// BenchmarkLookup compares lookups on the service with a bare NATS echo
// responder on the same connections: the service's own cost per request.
// The two alternate request by request, so that a noisy machine slows
// both alike, and the client does the same for both (send prepared bytes,
// take the reply's bytes), so the difference is the service's. It
// reports each one's time per request and lookups as a share of echo
// throughput; TestServiceEndToEnd checks what lookups answer.
func BenchmarkLookup(b *testing.B) {
	serverNC, clientNC, _, first, _, stopFollow := benchSetup(b, 1000)
	stopFollow()
	if _, err := serverNC.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		b.Fatal(err)
	}
	_ = serverNC.Flush()
	ws := first.Plan.Workers.Slice()
	reqs := make([][]byte, 1024)
	for k := range reqs {
		w := ws[(k*7919)%len(ws)]
		reqs[k], _ = json.Marshal(wire.LookupRequest{Plan: "default", Component: string(w.Component), Index: &w.Index})
	}
	var inService, inEcho time.Duration
	i := 0
	for b.Loop() {
		req := reqs[i%len(reqs)]
		i++
		t0 := time.Now()
		m, err := clientNC.Request(client.LookupSubject, req, 5*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error-Code") != "" || !bytes.Contains(m.Data, []byte(`"cuda_visible_devices"`)) {
			b.Fatalf("lookup %s: %v %s", req, err, m.Data)
		}
		t1 := time.Now()
		if m, err := clientNC.Request("bench.echo", req, 5*time.Second); err != nil || len(m.Data) == 0 {
			b.Fatal(err)
		}
		inService += t1.Sub(t0)
		inEcho += time.Since(t1)
	}
	b.ReportMetric(float64(inService.Nanoseconds())/float64(i), "lookup-ns/op")
	b.ReportMetric(float64(inEcho.Nanoseconds())/float64(i), "echo-ns/op")
	b.ReportMetric(100*float64(inEcho)/float64(inService), "lookup-%-of-echo")
}
