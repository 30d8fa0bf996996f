package api

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// TestPlanNamesAtTheBus: the validate endpoint's plan header refuses a
// plan name of 4,100 bytes, or one with a dot, with a 400 before it
// reaches a subject or a key, and the connection stays up. (The spec
// store's: store.TestPlanNamesAtTheStore.)
func TestPlanNamesAtTheBus(t *testing.T) {
	nc, err := bus.Connect(natstest.Start(t).URL(), "test", zerolog.Nop(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err := bus.AddService(nc, Endpoints(stubAnswerer{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	spec := []byte("scheduling:\n  train: {worker_num: 1, num_cpus: 1, num_gpus: 1}\n")
	for _, name := range []string{strings.Repeat("p", 4100), "a.b"} {
		msg := nats.NewMsg(client.ValidateSubject)
		msg.Header.Set(client.PlanHeader, name)
		msg.Data = spec
		reply, err := nc.RequestMsg(msg, bus.HandlerTimeout)
		if err != nil {
			t.Fatalf("validate: %v", err)
		}
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != wire.CodeBadRequest || !strings.Contains(string(reply.Data), "invalid plan name") {
			t.Errorf("validate as %.20q: code %q body %s", name, code, reply.Data)
		}
	}
	if !nc.IsConnected() {
		t.Error("the connection went down")
	}
}

// stubAnswerer answers nothing; the endpoints refuse these requests
// first.
type stubAnswerer struct{}

func (stubAnswerer) Validate(context.Context, []byte, string) (*client.ValidateReply, error) {
	return nil, errors.New("not reached")
}

func (stubAnswerer) Plan(context.Context, wire.PlanRequest) (*planner.Plan, error) {
	return nil, errors.New("not reached")
}
