package api

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// TestLookupEchoesBounded: a lookup's refusal quotes what the requester
// sent at most 64 bytes of it, so a megabyte's component name is not
// answered with a megabyte (twice: the error header and the body).
func TestLookupEchoesBounded(t *testing.T) {
	zero := 0
	for _, c := range []struct {
		name, component, want string
	}{
		{"short", "trian", `component "trian": want train, eval, env or buffer`},
		{"a megabyte", strings.Repeat("x", 1<<20), `component "` + strings.Repeat("x", 64) + `"… (1048576 bytes): want`},
		{"cut at a rune", strings.Repeat("x", 63) + strings.Repeat("é", 100), `component "` + strings.Repeat("x", 63) + `"… (263 bytes)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A nil Answerer: the request is refused before any plan is read.
			_, err := lookup(context.Background(), nil, wire.LookupRequest{Component: c.component, Index: &zero})
			if !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%.300v, want a bad request with %.200q", err, c.want)
			}
			if len(err.Error()) > 256 {
				t.Errorf("a %d-byte reason", len(err.Error()))
			}
		})
	}
}
