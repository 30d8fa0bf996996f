package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	"github.com/poolplanner/poolplanner/plan"
)

// secureServer starts an embedded server that requires credentials
// signed by a fresh authority, and makes the plan stream, buckets and
// object stores as a planner would.
func secureServer(t *testing.T) (*auth.Authority, string) {
	t.Helper()
	dir := t.TempDir()
	a, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: dir, Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	s := as(t, a, url, auth.Planner, "")
	ctx := context.Background()
	if err := NewPlanStore(s.js).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewInventoryStore(s.js).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSpecStore(s.js).KV(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewDrainStore(s.js).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return a, url
}

// session is a connection with a role's credentials; errs collects what
// the server refused, which NATS reports apart from the request.
type session struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	sec  bus.Security
	mu   sync.Mutex
	errs []string
}

func as(t *testing.T, a *auth.Authority, url string, role auth.Role, node string) *session {
	t.Helper()
	creds, err := a.Creds(role, node, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), string(role)+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &session{sec: bus.Security{Creds: path}}
	opts, err := s.sec.Options()
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.errs = append(s.errs, err.Error())
	}))
	if s.nc, err = nats.Connect(url, opts...); err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(s.nc.Close)
	s.js, _ = jetstream.New(s.nc)
	return s
}

// refused waits for the server to report a permissions violation on
// subject, and checks that the request failed.
func (s *session) refused(t *testing.T, err error, subject string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: allowed", subject)
	}
	want := `Permissions Violation for Publish to "` + subject + `"`
	if strings.HasPrefix(subject, "sub ") {
		want = `Permissions Violation for Subscription to "` + strings.TrimPrefix(subject, "sub ") + `"`
	}
	natstest.WaitFor(t, 3*time.Second, fmt.Sprintf("the server saying %q (the request: %v)", want, err), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Contains(strings.Join(s.errs, "\n"), want)
	})
	if msg := bus.Explain(err, s.nc, s.sec).Error(); !strings.Contains(msg, "permissions violation") || !strings.Contains(msg, subject) && !strings.HasPrefix(subject, "sub ") {
		t.Errorf("explained as %q", msg)
	}
}

// TestAuthDenials: with --auth, each role is refused what it must not
// do, each with the server's error; and allowed what it needs.
func TestAuthDenials(t *testing.T) {
	a, url := secureServer(t)
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	doc := testDoc(t, "n1")

	t.Run("anonymous", func(t *testing.T) {
		_, err := nats.Connect(url)
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("anonymous connect: %v", err)
		}
		if msg := bus.Explain(err, nil, bus.Security{}).Error(); !strings.Contains(msg, "pass --creds") {
			t.Errorf("explained as %q", msg)
		}
	})
	t.Run("reporter writes another node's key", func(t *testing.T) {
		r := as(t, a, url, auth.Reporter, "n1")
		_, err := r.js.Publish(short(), bus.InventorySubject("n2"), testDoc(t, "n2"))
		r.refused(t, err, bus.InventorySubject("n2"))
	})
	t.Run("reporter rolls up the bucket", func(t *testing.T) {
		r := as(t, a, url, auth.Reporter, "n1")
		msg := nats.NewMsg(bus.InventorySubject("n1"))
		msg.Header.Set("Nats-Rollup", "all")
		msg.Data = doc
		_, err := r.js.PublishMsg(short(), msg)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "rollup") {
			t.Fatalf("rollup: %v", err)
		}
	})
	t.Run("reporter purges the bucket", func(t *testing.T) {
		r := as(t, a, url, auth.Reporter, "n1")
		err := r.js.DeleteStream(short(), bus.InventoryStream)
		r.refused(t, err, "$JS.API.STREAM.DELETE."+bus.InventoryStream)
		_, err = r.nc.Request("$JS.API.STREAM.PURGE."+bus.InventoryStream, nil, 500*time.Millisecond)
		r.refused(t, err, "$JS.API.STREAM.PURGE."+bus.InventoryStream)
	})
	t.Run("reporter deletes the plans stream", func(t *testing.T) {
		r := as(t, a, url, auth.Reporter, "n1")
		err := r.js.DeleteStream(short(), client.PlansStream)
		r.refused(t, err, "$JS.API.STREAM.DELETE."+client.PlansStream)
	})
	t.Run("launcher forges a revision", func(t *testing.T) {
		l := as(t, a, url, auth.Launcher, "")
		_, err := l.js.Publish(short(), client.PlanEventSubject("default"), []byte(`{"revision":99}`))
		l.refused(t, err, client.PlanEventSubject("default"))
	})
	t.Run("launcher sets a spec", func(t *testing.T) {
		l := as(t, a, url, auth.Launcher, "")
		_, err := NewSpecStore(l.js).Put(short(), "default", []byte("scheduling: {train: {worker_num: 1, num_cpus: 1, num_gpus: 1}}"))
		l.refused(t, err, "$KV."+client.SpecBucket+".default")
	})
	t.Run("readers take the planner's consumer slots", func(t *testing.T) {
		// The inventory, spec and drain streams' consumers are the
		// planner's alone (a client filling their cap would blind it);
		// readers list all three without one.
		gpu := 1
		drain := Drain{NodeID: "n1", GPU: &gpu, Cause: plan.DrainOperator, By: "test", At: time.Now()}
		if err := NewDrainStore(as(t, a, url, auth.Admin, "").js).Put(short(), drain); err != nil {
			t.Fatalf("admin drains: %v", err)
		}
		for _, role := range []auth.Role{auth.Launcher, auth.Admin} {
			c := as(t, a, url, role, "")
			for _, stream := range []string{bus.InventoryStream, "KV_" + client.SpecBucket, "KV_" + client.DrainBucket} {
				_, err := c.js.CreateConsumer(short(), stream, jetstream.ConsumerConfig{Durable: "squat"})
				c.refused(t, err, "$JS.API.CONSUMER.CREATE."+stream+".squat")
				_, err = c.js.CreateConsumer(short(), stream, jetstream.ConsumerConfig{Durable: "squat", FilterSubject: "$KV.x.y"})
				c.refused(t, err, "$JS.API.CONSUMER.CREATE."+stream+".squat.$KV.x.y")
				err = c.js.DeleteConsumer(short(), stream, "planners")
				c.refused(t, err, "$JS.API.CONSUMER.DELETE."+stream+".planners")
			}
			if _, err := NewInventoryStore(c.js).List(short()); err != nil {
				t.Errorf("%s lists the inventory: %v", role, err)
			}
			if _, err := NewSpecStore(c.js).List(short()); err != nil {
				t.Errorf("%s lists the specs: %v", role, err)
			}
			ds := NewDrainStore(c.js)
			ds.NoCreate = true
			if got, bad, err := ds.List(short()); err != nil || len(bad) > 0 || len(got) != 1 || got[0].Target() != "n1:1" {
				t.Errorf("%s lists the drains: %v %v %v, want n1:1", role, got, bad, err)
			}
			// Where readers do read through consumers, they may.
			if _, err := c.js.CreateConsumer(short(), client.AssignmentsStream, jetstream.ConsumerConfig{}); err != nil {
				t.Errorf("%s makes a consumer of the assignments: %v", role, err)
			}
		}
	})
	t.Run("launcher answers lookups", func(t *testing.T) {
		l := as(t, a, url, auth.Launcher, "")
		if _, err := l.nc.Subscribe(client.LookupSubject, func(m *nats.Msg) { _ = m.Respond([]byte("{}")) }); err != nil {
			t.Fatal(err)
		}
		_ = l.nc.Flush()
		// The subscription is made locally; the server refuses it.
		l.refused(t, errors.New("subscription refused"), "sub "+client.LookupSubject)
	})

	t.Run("reporter reads others' replies", func(t *testing.T) {
		r := as(t, a, url, auth.Reporter, "n1")
		if _, err := r.nc.SubscribeSync("_INBOX.>"); err != nil {
			t.Fatal(err)
		}
		_ = r.nc.Flush()
		r.refused(t, errors.New("subscription refused"), "sub _INBOX.>")
	})
	t.Run("launcher listens on a stream's subject", func(t *testing.T) {
		l := as(t, a, url, auth.Launcher, "")
		if _, err := l.nc.SubscribeSync(client.AssignmentSubject("default", "n2")); err != nil {
			t.Fatal(err)
		}
		_ = l.nc.Flush()
		l.refused(t, errors.New("subscription refused"), "sub "+client.AssignmentSubject("default", "n2"))
	})
	t.Run("launcher replays through a push consumer", func(t *testing.T) {
		// A consumer delivering the plan stream onto an assignment subject
		// would have the assignments stream store what it delivers, if
		// anyone listened there; no reader may.
		ctx := context.Background()
		p := as(t, a, url, auth.Planner, "")
		if _, err := p.js.Publish(ctx, client.PlanEventSubject("replay"), []byte(`{"revision":1}`)); err != nil {
			t.Fatal(err)
		}
		st, _ := p.js.Stream(ctx, client.AssignmentsStream)
		before, _ := st.Info(ctx)
		l := as(t, a, url, auth.Launcher, "")
		target := client.AssignmentSubject("default", "n9")
		_, _ = l.nc.SubscribeSync(target) // the audience it would need: refused
		_ = l.nc.Flush()
		_, _ = l.js.CreateConsumer(ctx, client.PlansStream, jetstream.ConsumerConfig{Name: "replay",
			FilterSubject: client.PlanEventSubject("replay"), AckPolicy: jetstream.AckNonePolicy})
		req := `{"stream_name":"` + client.PlansStream + `","config":{"name":"push","deliver_subject":"` + target + `","ack_policy":"none","filter_subject":"` + client.PlanEventSubject("replay") + `"}}`
		_, _ = l.nc.Request("$JS.API.CONSUMER.CREATE."+client.PlansStream+".push", []byte(req), time.Second)
		time.Sleep(time.Second)
		// A delivery is stored under the subject it had in its own
		// stream: count messages.
		if after, _ := st.Info(ctx); after.State.LastSeq != before.State.LastSeq {
			t.Fatalf("the assignments stream stored a delivery: sequence %d, was %d", after.State.LastSeq, before.State.LastSeq)
		}
	})

	t.Run("allowed", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := as(t, a, url, auth.Reporter, "n1")
		store := NewInventoryStore(r.js)
		store.NoCreate = true
		for _, heartbeat := range []bool{false, true} {
			if _, err := store.Put(ctx, "n1", doc, heartbeat, time.Minute); err != nil {
				t.Fatalf("reporter put (heartbeat %v): %v", heartbeat, err)
			}
		}
		if err := store.Delete(ctx, "n1", time.Minute); err != nil {
			t.Fatalf("reporter delete: %v", err)
		}
		adm := as(t, a, url, auth.Admin, "")
		if _, err := NewSpecStore(adm.js).Put(ctx, "default", []byte("scheduling: {train: {worker_num: 1, num_cpus: 1, num_gpus: 1}}")); err != nil {
			t.Fatalf("admin sets a spec: %v", err)
		}
		l := as(t, a, url, auth.Launcher, "")
		c, _ := client.New(l.nc)
		if err := c.History(ctx, "default", func(client.Info) bool { return true }); err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("launcher reads the history: %v", err)
		}
		for _, s := range []*session{r, adm, l} {
			s.mu.Lock()
			if len(s.errs) > 0 {
				t.Errorf("refused: %v", s.errs)
			}
			s.mu.Unlock()
		}
	})
}
