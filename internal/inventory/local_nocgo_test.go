//go:build !cgo

package inventory

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestOpenLocalWithoutCgo: a build without cgo reports the node with no
// GPUs and says why in one line.
func TestOpenLocalWithoutCgo(t *testing.T) {
	var logs bytes.Buffer
	src, stop := OpenLocal(context.Background(), NVMLOptions{Facts: Facts{NodeID: "n1", IP: "10.0.0.1"}, Log: zerolog.New(&logs)}, true)
	defer stop()
	inv, err := src.Inventory(context.Background())
	if err != nil || inv.NodeID != "n1" || len(inv.GPUs) != 0 {
		t.Fatalf("inventory %+v, %v", inv, err)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "built without cgo") {
		t.Errorf("log: %q", logs.String())
	}
}
