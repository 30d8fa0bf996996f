package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/client"
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

// TestPlanNamesAtTheStore: the spec store refuses a plan name of 4,100
// bytes with a 400 before it reaches a key, and the connection stays up.
// (The validate endpoint's plan header: api.TestPlanNamesAtTheBus.)
func TestPlanNamesAtTheStore(t *testing.T) {
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
	if _, err := specs.Put(ctx, "ok", spec); err != nil || !nc.IsConnected() {
		t.Errorf("after: put %v, connected %v", err, nc.IsConnected())
	}
}
