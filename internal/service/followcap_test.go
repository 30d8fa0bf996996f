package service

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/gpumap"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestLauncherCannotDelayStandby: a launcher holding every consumer slot
// of POOLPLANNER_PLANS (the cap counts the planner's consumers too)
// keeps neither a standby planner from following the leader's new
// revisions at once, nor its GPU map from redrawing; the standby then
// takes over, continuing the revisions. Both follow the stream's
// republished headers with direct gets: with the ordered consumers they
// used before, neither follows until a slot is free.
func TestLauncherCannotDelayStandby(t *testing.T) {
	t.Parallel()
	connect := secureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type running struct {
		p    *Service
		nc   *nats.Conn
		stop func()
	}
	start := func() running {
		pnc, pjs := connect(auth.Planner, "")
		p := New(Config{NC: pnc, JS: pjs, Spec: []byte(testSpec), Debounce: 20 * time.Millisecond, Settle: -1, LeaseTTL: time.Second, Log: zerolog.Nop()})
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(pctx) }()
		return running{p, pnc, func() { stop(); <-done; pnc.Close() }}
	}
	reporters := map[string]*store.InventoryStore{}
	put := func(id string) {
		_, js := connect(auth.Reporter, id)
		invs := store.NewInventoryStore(js)
		invs.NoCreate = true
		reporters[id] = invs
		natstest.WaitFor(t, 20*time.Second, "reporter "+id+" put its node", func() bool {
			_, err := invs.Put(ctx, id, simDoc(id), false, time.Minute)
			return err == nil
		})
	}
	lnc, ljs := connect(auth.Launcher, "")
	lc, _ := client.New(lnc)
	latest := func() (int, string) {
		r, err := lc.Plan(ctx, "default", 0)
		if err != nil {
			return 0, ""
		}
		return r.Document.Revision, r.Publisher
	}
	revision := func(want int) {
		t.Helper()
		natstest.WaitFor(t, 30*time.Second, fmt.Sprintf("revision %d published", want), func() bool {
			rev, _ := latest()
			return rev == want
		})
	}
	follows := func(r running, rev int) {
		t.Helper()
		natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("the standby holding revision %d", rev), func() bool {
			return slices.ContainsFunc(r.p.Plans(), func(p *planner.Plan) bool { return p.Name == "default" && p.Revision == rev })
		})
	}

	leader := start()
	put("n1")
	revision(1)

	// A push consumer the launcher points at the republished subject:
	// the standby and the map listening there are an audience, so it
	// delivers the plan history to them (with an ack reply, which no
	// republish has: dropped), and no stream stores it.
	pushCfg, _ := json.Marshal(map[string]any{"stream_name": client.PlansStream, "config": map[string]any{
		"name": "cues", "deliver_subject": client.PlanRepublishSubject("default"), "ack_policy": "none", "deliver_policy": "all"}})
	if reply, err := lnc.Request("$JS.API.CONSUMER.CREATE."+client.PlansStream+".cues", pushCfg, 5*time.Second); err != nil || strings.Contains(string(reply.Data), `"error"`) {
		t.Fatalf("the launcher's push consumer: %v %s", err, reply.Data)
	}
	// The launcher takes every slot the stream has left. In memory: the
	// cap counts them as any, and a file-backed one costs the server a
	// store to make and, at shutdown, to close (seconds for the thousand).
	made := 0
	for k := range 1100 {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := ljs.CreateConsumer(cctx, client.PlansStream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("squat-%d", k), MemoryStorage: true})
		ccancel()
		if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
			break
		}
		if err != nil {
			t.Fatalf("consumer %d: %v", k, err)
		}
		made++
	}
	_, pjs := connect(auth.Planner, "")
	if _, err := pjs.OrderedConsumer(ctx, client.PlansStream, jetstream.OrderedConsumerConfig{}); !errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		t.Fatalf("after the launcher's %d consumers the planner's account still makes one (%v): the stream is not full", made, err)
	}

	standby := start()
	defer standby.stop()
	events := mapEvents(t, ctx, standby.p, standby.nc)
	follows(standby, 1)

	put("n2") // the plan fits now: revision 2, by the leader
	revision(2)
	follows(standby, 2)
	events.want(t, 2)

	leader.stop() // gives the lease back; the standby leads
	natstest.WaitFor(t, 10*time.Second, "the standby leading", func() bool { return standby.p.leading() != 0 })
	if rev, _ := latest(); rev != 2 {
		t.Fatalf("taking over published revision %d with nothing changed", rev)
	}
	if err := reporters["n1"].Delete(ctx, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	revision(3)
	if _, by := latest(); by != standby.p.plans.Publisher() {
		t.Errorf("revision 3 published by %q, want the standby %q", by, standby.p.plans.Publisher())
	}
	events.want(t, 3)

	// (Read without a consumer: the launcher holds every slot.)
	st, err := ljs.Stream(ctx, client.PlansStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(client.PlanEventSubject("default")))
	if err != nil {
		t.Fatal(err)
	}
	if n := si.State.Subjects[client.PlanEventSubject("default")]; n != 3 {
		t.Errorf("the plan stream holds %d events of the plan, want its 3 revisions", n)
	}
	reply, err := lnc.Request("$JS.API.CONSUMER.INFO."+client.PlansStream+".cues", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Delivered struct {
			Consumer uint64 `json:"consumer_seq"`
		} `json:"delivered"`
	}
	if err := json.Unmarshal(reply.Data, &info); err != nil || info.Delivered.Consumer == 0 {
		t.Errorf("the launcher's push consumer delivered nothing (%v, %s): the test shows no audience at the cue subject", err, reply.Data)
	}
}

// mapCues is a GPU map's event stream, read as it comes.
type mapCues struct {
	revs chan gpumap.Revision
}

// mapEvents serves a GPU map of p on a free port and opens its event
// stream.
func mapEvents(t *testing.T, ctx context.Context, p *Service, nc *nats.Conn) mapCues {
	t.Helper()
	l, err := gpumap.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	if err := gpumap.NewServer(p, zerolog.Nop()).Serve(mctx, l, nc); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(mctx, http.MethodGet, "http://"+l.Addr().String()+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	c := mapCues{revs: make(chan gpumap.Revision, 64)}
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			var r gpumap.Revision
			if ok && json.Unmarshal([]byte(data), &r) == nil {
				c.revs <- r
			}
		}
	}()
	return c
}

// want waits for the map to announce revision rev of plan default.
func (c mapCues) want(t *testing.T, rev int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-c.revs:
			if r.Plan == "default" && r.Revision >= rev {
				return
			}
		case <-deadline:
			t.Fatalf("the GPU map announced no revision %d", rev)
		}
	}
}
