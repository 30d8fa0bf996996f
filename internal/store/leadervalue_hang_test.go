package store

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/bus"
)

// TestLeaderValueUnanswered (review rev9; fails without its deadline): in a cluster a server that is
// not the stream's leader (or lacks the stream's assignment, or sees no
// leader yet) drops STREAM.MSG.GET silently, and a reply is lost in a
// reconnect. leaderValue's request then waits on the watch's context,
// which has no deadline: the watch stalls for good. jetstream's own
// reads (the direct get just before it) give up after DefaultTimeout.
func TestLeaderValueUnanswered(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A responder that never answers: a server that is not the leader.
	if _, err := nc.Subscribe("$JS.API.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	s := NewInventoryStore(js)

	done := make(chan error, 1)
	go func() {
		_, err := s.leaderValue(context.Background(), bus.InventorySubjectPrefix+"n1", 1)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("leaderValue of an unanswered request returned no error")
		}
	case <-time.After(3 * (5 * time.Second)):
		t.Fatalf("leaderValue(Background) still waiting after %v: a watch stalls on it", 3*(5*time.Second))
	}
}
