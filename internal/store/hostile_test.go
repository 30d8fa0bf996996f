package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// refusingAnswerer answers every request with an error: an error reply
// is a message too, and would land in a stream as well as any answer.
type refusingAnswerer struct{}

func (refusingAnswerer) Validate(context.Context, []byte, string) (any, error) {
	return nil, fmt.Errorf("%w: no", client.ErrBadRequest)
}

func (refusingAnswerer) Lookup(context.Context, wire.LookupRequest) (any, error) {
	return nil, fmt.Errorf("%w: no worker", client.ErrNotFound)
}

func (refusingAnswerer) Plan(context.Context, wire.PlanRequest) (any, error) {
	return nil, fmt.Errorf("%w: no plan", client.ErrNotFound)
}

// streamState is every stream's message count per subject.
func streamState(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]uint64{}
	for name := range js.StreamNames(ctx).Name() {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subj, n := range info.State.Subjects {
			out[name+" "+subj] = n
		}
		out[name+" (last sequence)"] = info.State.LastSeq
	}
	return out
}

// TestHostileReplies: a client of any role names a stream's subject as
// the reply of every request it may send (the service's endpoints,
// JetStream's API, its own put, micro discovery), and points push
// consumers at those subjects; no stream gains a message. The same
// request from inside the planner's account does write (the control:
// this is how the holes looked).
func TestHostileReplies(t *testing.T) {
	a, url := secureServer(t)
	ctx := context.Background()
	p := as(t, a, url, auth.Planner, "")
	svc, err := bus.AddService(p.nc, refusingAnswerer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	// A reporter's key and a plan revision, for gets and consumers to
	// read.
	reporter := as(t, a, url, auth.Reporter, "n1")
	inv := NewInventoryStore(reporter.js)
	inv.NoCreate = true
	if _, err := inv.Put(ctx, "n1", testDoc(t, "n1"), false, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := p.js.Publish(ctx, client.PlanEventSubject("default"), []byte(`{"revision":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSpecStore(p.js).KV(ctx); err != nil {
		t.Fatal(err)
	}

	targets := []string{
		client.AssignmentSubject("default", "n2"),
		client.PlanEventSubject("default"),
		bus.LeaseSubject("default"),
		bus.InventorySubject("n3"),
		"$KV." + client.SpecBucket + ".default",
		"$O." + client.PlansBucket + ".M.x",
	}
	lookup := []byte(`{"plan":"default","node_id":"n1"}`)
	// Each request a role may send, and a probe: the same request with
	// an inbox reply, whose answer says the server has dealt with the
	// hostile one before it (one connection's messages are handled in
	// order).
	type request struct {
		subject string
		body    []byte
	}
	launcherReqs := []request{
		{client.LookupSubject, lookup},
		{client.PlanSubject, []byte(`{"plan":"default"}`)},
		{client.ValidateSubject, []byte(`{}`)},
		{"$SRV.PING", nil},
		{"$JS.API.STREAM.INFO." + client.PlansStream, nil},
		{"$JS.API.DIRECT.GET." + bus.InventoryStream, []byte(`{"last_by_subj":"` + bus.InventorySubject("n1") + `"}`)},
		{"$JS.API.DIRECT.GET." + bus.InventoryStream + "." + bus.InventorySubject("n1"), nil},
	}
	reporterReqs := []request{
		{"$JS.API.STREAM.INFO." + bus.InventoryStream, nil},
		{"$JS.API.DIRECT.GET." + bus.InventoryStream + "." + bus.InventorySubject("n1"), nil},
		{bus.InventorySubject("n1"), testDoc(t, "n1")},
	}
	roles := []struct {
		role auth.Role
		node string
		reqs []request
	}{
		{auth.Launcher, "", launcherReqs},
		{auth.Admin, "", launcherReqs},
		{auth.Reporter, "n1", reporterReqs},
	}
	for _, r := range roles {
		t.Run(string(r.role), func(t *testing.T) {
			s := as(t, a, url, r.role, r.node)
			before := streamState(t, p.js)
			for _, req := range r.reqs {
				for _, target := range targets {
					if err := s.nc.PublishMsg(&nats.Msg{Subject: req.subject, Reply: target, Data: req.body}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := s.nc.Request(req.subject, req.body, 5*time.Second); err != nil && req.subject != client.ValidateSubject {
					t.Fatalf("probe %s: %v", req.subject, err)
				}
			}
			if r.role != auth.Reporter {
				// A pull consumer's deliveries go to the reply of its
				// fetch.
				cons, err := s.js.CreateConsumer(ctx, client.PlansStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
				if err != nil {
					t.Fatal(err)
				}
				next := "$JS.API.CONSUMER.MSG.NEXT." + client.PlansStream + "." + cons.CachedInfo().Name
				for _, target := range targets {
					_ = s.nc.PublishMsg(&nats.Msg{Subject: next, Reply: target, Data: []byte(`{"batch":10,"no_wait":true}`)})
				}
				if _, err := s.nc.Request(next, []byte(`{"batch":1,"no_wait":true}`), 5*time.Second); err != nil {
					t.Fatalf("probe fetch: %v", err)
				}
			}
			after := streamState(t, p.js)
			if r.role == auth.Reporter {
				// Its own puts, the probe's and the hostile ones: its
				// own key, nothing else.
				own := bus.InventoryStream + " " + bus.InventorySubject("n1")
				if after[own] <= before[own] {
					t.Errorf("the reporter's own puts were not stored")
				}
				delete(before, own)
				delete(after, own)
				delete(before, bus.InventoryStream+" (last sequence)")
				delete(after, bus.InventoryStream+" (last sequence)")
			}
			if !maps.Equal(before, after) {
				t.Errorf("streams changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}

	t.Run("push consumers", func(t *testing.T) {
		l := as(t, a, url, auth.Launcher, "")
		before := streamState(t, p.js)
		var names []string
		for i, target := range targets {
			stream := client.PlansStream
			if target == client.PlanEventSubject("default") || target == bus.LeaseSubject("default") {
				// Not the inventory: no client may make a consumer there.
				stream = client.AssignmentsStream
			}
			cfg, _ := json.Marshal(map[string]any{"stream_name": stream, "config": map[string]any{
				"name": fmt.Sprintf("push%d", i), "deliver_subject": target, "ack_policy": "none", "deliver_policy": "all"}})
			reply, err := l.nc.Request(fmt.Sprintf("$JS.API.CONSUMER.CREATE.%s.push%d", stream, i), cfg, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var created struct {
				Error *struct{ Description string } `json:"error"`
			}
			_ = json.Unmarshal(reply.Data, &created)
			if created.Error == nil {
				names = append(names, stream+"/"+fmt.Sprintf("push%d", i))
			}
		}
		// A push consumer delivers only to an audience; whether one
		// exists can change as others subscribe, so watch each consumer
		// for a while rather than once.
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			for _, n := range names {
				stream, name, _ := strings.Cut(n, "/")
				c, err := p.js.Consumer(ctx, stream, name)
				if err != nil {
					continue // an ephemeral gone for want of interest
				}
				if info, err := c.Info(ctx); err == nil && info.Delivered.Consumer > 0 {
					t.Fatalf("consumer %s delivered %d messages to %s", n, info.Delivered.Consumer, info.Config.DeliverSubject)
				}
			}
			time.Sleep(50 * time.Millisecond) // polling a consumer's state: nothing to wait on
		}
		if after := streamState(t, p.js); !maps.Equal(before, after) {
			t.Errorf("streams changed:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("control: the planner's own account", func(t *testing.T) {
		// Inside the account that holds the streams, JetStream answers
		// to any reply: the hole the accounts close.
		target := client.AssignmentSubject("control", "n9")
		st, err := p.js.Stream(ctx, client.AssignmentsStream)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.nc.PublishMsg(&nats.Msg{Subject: "$JS.API.STREAM.INFO." + client.PlansStream, Reply: target}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			_, err := st.GetLastMsgForSubject(ctx, target)
			return err == nil
		})
	})
}

// waitFor waits for cond, failing the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, 10*time.Second, "the condition met", cond)
}

// countingAnswerer is a refusingAnswerer that counts, as the planner's
// metrics do, what it answered and with which code.
type countingAnswerer struct {
	refusingAnswerer
	mu    sync.Mutex
	codes map[string]int
}

func (c *countingAnswerer) ObserveRequest(_, code string, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.codes[code]++
}

func (c *countingAnswerer) count(code string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.codes[code]
}

// TestReplyOnlyToInboxes: even without accounts (an open server), the
// service answers only to an inbox; a request naming a stream's
// subject as its reply is counted and left unanswered.
func TestReplyOnlyToInboxes(t *testing.T) {
	_, url := startServer(t)
	nc, js := connect(t, url)
	ctx := context.Background()
	if err := NewPlanStore(js).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	a := &countingAnswerer{codes: map[string]int{}}
	svc, err := bus.AddService(nc, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	before := streamState(t, js)
	target := client.AssignmentSubject("default", "n2")
	for _, subj := range []string{client.LookupSubject, client.PlanSubject, client.ValidateSubject} {
		if err := nc.PublishMsg(&nats.Msg{Subject: subj, Reply: target, Data: []byte(`{"plan":"default"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return a.count(bus.CodeForbiddenReply) == 3 })
	if _, err := nc.Request(client.PlanSubject, []byte(`{"plan":"default"}`), 5*time.Second); err != nil {
		t.Fatalf("a request with an inbox: %v", err)
	}
	if after := streamState(t, js); !maps.Equal(before, after) {
		t.Errorf("streams changed:\nbefore %v\nafter  %v", before, after)
	}
	for _, r := range []string{"_INBOX.abc", "_R_.x.y", "_INBOX_other", "poolplanner.plans.x", "$JS.ACK.x", ""} {
		want := r == "_INBOX.abc" || r == "_R_.x.y"
		if got := bus.ReplyAllowed(r); got != want {
			t.Errorf("ReplyAllowed(%q) = %v, want %v", r, got, want)
		}
	}
}

// TestClientsReadThroughImports: what a client reads crosses the
// accounts whole: a large object (a push consumer with flow control,
// delivering to the client's inbox), a plan's revisions through an
// ordered consumer, a key by direct get.
func TestClientsReadThroughImports(t *testing.T) {
	a, url := secureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := as(t, a, url, auth.Planner, "")
	obs, err := p.js.ObjectStore(ctx, client.RepliesBucket)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if _, err := obs.PutBytes(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	for rev := 1; rev <= 3; rev++ {
		if _, err := p.js.Publish(ctx, client.PlanEventSubject("default"), fmt.Appendf(nil, `{"revision":%d}`, rev)); err != nil {
			t.Fatal(err)
		}
	}
	// A reporter whose node id is a hostname with dots writes its key
	// across the import (a subject of several tokens).
	r := as(t, a, url, auth.Reporter, "gpu-07.example.com")
	inv := NewInventoryStore(r.js)
	inv.NoCreate = true
	if _, err := inv.Put(ctx, "gpu-07.example.com", testDoc(t, "gpu-07.example.com"), false, time.Minute); err != nil {
		t.Fatalf("a dotted node's reporter puts its key: %v", err)
	}
	if err := inv.Delete(ctx, "gpu-07.example.com", time.Minute); err != nil {
		t.Fatalf("a dotted node's reporter deletes its key: %v", err)
	}
	l := as(t, a, url, auth.Launcher, "")
	lobs, err := l.js.ObjectStore(ctx, client.RepliesBucket)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lobs.GetBytes(ctx, "big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("launcher reads an 8 MB object: %d bytes, %v", len(got), err)
	}
	cons, err := l.js.OrderedConsumer(ctx, client.PlansStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{client.PlanEventSubject("default")}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 3 {
		t.Fatalf("launcher fetched %d revisions, want 3 (%v)", n, batch.Error())
	}
	for _, s := range []*session{l} {
		s.mu.Lock()
		if len(s.errs) > 0 {
			t.Errorf("refused: %v", s.errs)
		}
		s.mu.Unlock()
	}
}
