package bus

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestRefusalKinds: a refusal for want of peers is a setting to change
// (ErrReplicas) unless the server says why otherwise: peers lacking
// storage are a want of storage (the replies bucket is sized down), and
// peers offline an outage to wait out (the planner retries). A refusal
// naming no cause may be a cluster still forming (MayBeForming): the
// planner retries it for a while.
func TestRefusalKinds(t *testing.T) {
	noPeers := func(desc string) error {
		return &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: desc}
	}
	for _, c := range []struct {
		name              string
		err               error
		insufficient      bool
		replicas, storage bool
		forming           bool
	}{
		{"no peers", noPeers("no suitable peers for placement"), false, true, false, true},
		{"no peers: storage", noPeers("no suitable peers for placement, insufficient storage"), true, false, true, false},
		{"no peers: offline", noPeers("no suitable peers for placement, peer offline"), false, false, false, false},
		{"no peers: offline and storage", noPeers("no suitable peers for placement, peer offline, insufficient storage"), true, false, true, false},
		{"no peers: tags", noPeers("no suitable peers for placement, tags not matched ['az:1']"), false, true, false, false},
		{"insufficient resources", &jetstream.APIError{Code: 500, ErrorCode: 10023, Description: "insufficient resources"}, true, false, true, false},
		{"not clustered", &jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}, false, true, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := IsInsufficient(c.err); got != c.insufficient {
				t.Errorf("IsInsufficient = %v, want %v", got, c.insufficient)
			}
			err := ReplicasErr(c.err, 3)
			if got := errors.Is(err, ErrReplicas); got != c.replicas {
				t.Errorf("ErrReplicas = %v, want %v (%v)", got, c.replicas, err)
			}
			if got := errors.Is(err, ErrStorage); got != c.storage {
				t.Errorf("ErrStorage = %v, want %v (%v)", got, c.storage, err)
			}
			if got := MayBeForming(err); got != c.forming {
				t.Errorf("MayBeForming = %v, want %v (%v)", got, c.forming, err)
			}
		})
	}
}
