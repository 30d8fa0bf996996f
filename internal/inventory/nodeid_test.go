package inventory

import (
	"errors"
	"testing"
)

func TestValidateNodeID(t *testing.T) {
	for _, ok := range []string{"n1", "gpu-node-07.cluster.local", "a_b=c/d"} {
		if err := ValidateNodeID(ok); err != nil {
			t.Errorf("ValidateNodeID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", ".n1", "n1.", "n*", "n>", "ü"} {
		if err := ValidateNodeID(bad); !errors.Is(err, ErrInvalidNodeID) {
			t.Errorf("ValidateNodeID(%q) = %v, want ErrInvalidNodeID", bad, err)
		}
	}
}
