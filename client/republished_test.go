package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

func wholeEvent(name string, rev int) *plan.Event {
	ev := &plan.Event{Base: rev, Placement: &plan.Placement{ResourcePool: []plan.PoolExport{}, Pools: []plan.Pool{}, StorageToTrainWorkers: map[string][]int{}}}
	ev.Name, ev.Revision = name, rev
	return ev
}

// TestRepublishedFollow: a follow without a consumer delivers the latest
// revision and then every new one, in order, whether each comes with its
// cue or only a poll finds it (a stream without RePublish: cues lost),
// skipping what Skip skips, and unmoved by forged cues or another plan's
// events in between.
func TestRepublishedFollow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		republish bool
		forge     bool
		skip      int
		want      []int
	}{
		{name: "cued", republish: true, want: []int{1, 2, 3, 4, 5}},
		{name: "cues lost: polled", want: []int{1, 2, 3, 4, 5}},
		{name: "forged cues", republish: true, forge: true, want: []int{1, 2, 3, 4, 5}},
		{name: "skip", republish: true, skip: 3, want: []int{1, 2, 4, 5}},
		{name: "skip, polled", skip: 3, want: []int{1, 2, 4, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t)
			nc := srv.Conn(t)
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := bus.PlansStreamConfig(1)
			if !c.republish {
				cfg.RePublish = nil
			}
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			ps := store.NewPlanStore(js)
			last := map[string]uint64{}
			publish := func(name string, rev int) {
				t.Helper()
				seq, err := ps.PublishEvent(ctx, wholeEvent(name, rev), "d", last[name], 0)
				if err != nil {
					t.Fatal(err)
				}
				last[name] = seq
			}
			publish("default", 1)
			cl, _ := client.New(srv.Conn(t))
			opts := client.FollowOptions{Republished: true}
			if c.skip > 0 {
				opts.Skip = func(i client.Info) bool { return i.Revision == c.skip }
			}
			ch, err := cl.Follow(ctx, "default", opts)
			if err != nil {
				t.Fatal(err)
			}
			first := <-ch
			if c.forge {
				// Cues of sequences the stream never stored, one as a
				// push consumer's delivery would come (an ack reply).
				for _, reply := range []string{"", "$JS.ACK.POOLPLANNER_ASSIGNMENTS.x.1.1.1.1.0"} {
					h := nats.Header{}
					h.Set(jetstream.StreamHeader, client.PlansStream)
					h.Set(jetstream.SubjectHeader, client.PlanEventSubject("default"))
					h.Set(jetstream.SequenceHeader, "999")
					h.Set(jetstream.LastSequenceHeader, "998")
					h.Set(client.RevisionHeader, "99")
					if err := nc.PublishMsg(&nats.Msg{Subject: client.PlanRepublishSubject("default"), Reply: reply, Header: h}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for rev := 2; rev <= 5; rev++ {
				publish("other", rev-1)
				publish("default", rev)
			}
			got := []int{first.Document.Revision}
			timeout := time.After(30 * time.Second)
			for len(got) < len(c.want) {
				select {
				case r, ok := <-ch:
					if !ok {
						t.Fatalf("the follow ended after %v", got)
					}
					if r.Document.Name != "default" {
						t.Fatalf("delivered plan %q", r.Document.Name)
					}
					got = append(got, r.Document.Revision)
				case <-timeout:
					t.Fatalf("delivered %v, want %v", got, c.want)
				}
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("delivered %v, want %v", got, c.want)
				}
			}
			select {
			case r := <-ch:
				t.Fatalf("delivered revision %d past %v", r.Document.Revision, c.want)
			case <-time.After(3 * time.Second): // a poll's worth
			}
		})
	}
}

// TestRepublishedFollowEnds: a follow without a consumer ends when the
// history it read goes (the stream deleted, or made again), as a
// consumer's follow does, so that its caller follows again.
func TestRepublishedFollowEnds(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js := srv.JS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, bus.PlansStreamConfig(1)); err != nil {
		t.Fatal(err)
	}
	ps := store.NewPlanStore(js)
	var seq uint64
	for rev := 1; rev <= 3; rev++ {
		var err error
		if seq, err = ps.PublishEvent(ctx, wholeEvent("default", rev), "d", seq, 0); err != nil {
			t.Fatal(err)
		}
	}
	cl, _ := client.New(srv.Conn(t))
	ch, err := cl.Follow(ctx, "default", client.FollowOptions{Republished: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.Document.Revision != 3 {
		t.Fatalf("first delivered revision %d, want 3", r.Document.Revision)
	}
	if err := js.DeleteStream(ctx, client.PlansStream); err != nil {
		t.Fatal(err)
	}
	// The server removes a deleted stream's files as it goes: a create
	// of the same name at once may find them still there and refuse
	// (10049, "error creating store for stream", seen under -race).
	var createErr error
	natstest.WaitFor(t, 10*time.Second, "the plan stream made again", func() bool {
		_, createErr = js.CreateStream(ctx, bus.PlansStreamConfig(1))
		var apiErr *jetstream.APIError
		return createErr == nil || !errors.As(createErr, &apiErr) || apiErr.ErrorCode != 10049
	})
	if createErr != nil {
		t.Fatal(createErr)
	}
	if _, err := ps.PublishEvent(ctx, wholeEvent("default", 4), "d", 0, 0); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 20*time.Second, "the follow ended", func() bool {
		select {
		case _, ok := <-ch:
			return !ok
		default:
			return false
		}
	})
}

// TestCueOf: only the plan stream's republish is a cue.
func TestCueOf(t *testing.T) {
	t.Parallel()
	cue := func(mod func(*nats.Msg)) *nats.Msg {
		h := nats.Header{}
		h.Set(jetstream.StreamHeader, client.PlansStream)
		h.Set(jetstream.SubjectHeader, client.PlanEventSubject("p"))
		h.Set(jetstream.SequenceHeader, "7")
		h.Set(jetstream.LastSequenceHeader, "3")
		h.Set(client.RevisionHeader, "2")
		m := &nats.Msg{Subject: client.PlanRepublishSubject("p"), Header: h}
		if mod != nil {
			mod(m)
		}
		return m
	}
	for _, c := range []struct {
		name string
		m    *nats.Msg
		ok   bool
	}{
		{"republished", cue(nil), true},
		{"a consumer's delivery", cue(func(m *nats.Msg) { m.Reply = "$JS.ACK.S.c.1.7.7.0.0" }), false},
		{"another stream", cue(func(m *nats.Msg) { m.Header.Set(jetstream.StreamHeader, client.AssignmentsStream) }), false},
		{"another plan's subject", cue(func(m *nats.Msg) { m.Header.Set(jetstream.SubjectHeader, client.PlanEventSubject("q")) }), false},
		{"no sequence", cue(func(m *nats.Msg) { m.Header.Del(jetstream.SequenceHeader) }), false},
		{"previous not before", cue(func(m *nats.Msg) { m.Header.Set(jetstream.LastSequenceHeader, "7") }), false},
		{"not a plan's subject", cue(func(m *nats.Msg) { m.Subject = "poolplanner.plans.p" }), false},
	} {
		got, ok := client.CueOf(c.m)
		if ok != c.ok {
			t.Errorf("%s: ok %v, want %v", c.name, ok, c.ok)
		}
		if ok && (got.Plan != "p" || got.Seq != 7 || got.Prev != 3 || got.Info.Revision != 2) {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
}
