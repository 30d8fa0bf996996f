package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// TestValidatePlanName: plan names are 1 to 64 bytes of letters, digits
// and - _ =; any other is a 400 naming the length or the character and
// the rule.
func TestValidatePlanName(t *testing.T) {
	for _, c := range []struct {
		name, want string // want "": valid
	}{
		{"default", ""},
		{"exp", ""},
		{"grpo-qwen_7b=v2", ""},
		{strings.Repeat("p", 64), ""},
		{"", `invalid plan name "": empty; want 1 to 64 bytes of ASCII letters, digits and - _ =`},
		{strings.Repeat("p", 65), "65 bytes is too long; want 1 to 64 bytes"},
		{strings.Repeat("p", 4100), `"` + strings.Repeat("p", 34) + `"... (4100 bytes): 4100 bytes is too long`},
		{"a.b", `invalid plan name "a.b": '.' at byte 1 is not allowed; want 1 to 64 bytes`},
		{"a/b", `'/' at byte 1 is not allowed`},
		{"a b", `' ' at byte 1 is not allowed`},
		{"*", `'*' at byte 0 is not allowed`},
		{">", `'>' at byte 0 is not allowed`},
	} {
		err := ValidatePlanName(c.name)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.name, err)
		case c.want == "":
		case err == nil || !strings.Contains(err.Error(), c.want):
			t.Errorf("%.70q: %v, want %q", c.name, err, c.want)
		case !errors.Is(err, client.ErrBadRequest):
			t.Errorf("%.70q: %v is not a bad request", c.name, err)
			if len(err.Error()) > 200 {
				t.Errorf("%.70q: an error of %d bytes", c.name, len(err.Error()))
			}
		}
	}
}

// TestPlanNamesAtTheBus: the spec store and the validate endpoint's
// plan header refuse a plan name of 4,100 bytes with a 400 before it
// reaches a subject or a key, and the connection stays up.
func TestPlanNamesAtTheBus(t *testing.T) {
	_, url := startServer(t)
	nc, js := connect(t, url)
	ctx := context.Background()
	long := strings.Repeat("p", 4100)
	specs := NewSpecStore(js)
	spec := []byte("scheduling:\n  train: {worker_num: 1, num_cpus: 1, num_gpus: 1}\n")
	if _, err := specs.Put(ctx, long, spec); !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), "4100 bytes is too long") {
		t.Errorf("spec set: %v, want a 400 saying the length", err)
	}
	if err := specs.Delete(ctx, long); !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("spec rm: %v, want a 400", err)
	}
	svc, err := bus.AddService(nc, Endpoints(stubAnswerer{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	for _, name := range []string{long, "a.b"} {
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
	if _, err := specs.Put(ctx, "ok", spec); err != nil || !nc.IsConnected() {
		t.Errorf("after: put %v, connected %v", err, nc.IsConnected())
	}
}

// stubAnswerer answers nothing; the bus refuses these requests first.
type stubAnswerer struct{}

func (stubAnswerer) Validate(context.Context, []byte, string) (*client.ValidateReply, error) {
	return nil, errors.New("not reached")
}

func (stubAnswerer) Plan(context.Context, wire.PlanRequest) (*planner.Plan, error) {
	return nil, errors.New("not reached")
}
