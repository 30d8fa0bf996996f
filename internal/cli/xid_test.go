package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/store"
)

// TestReporterXID: reporter --simulate 8xH100 --xid injects XIDs as
// NVML reports them: one a reset resolves (94) turns healthy again at
// the next --health-every check, one that needs a reboot (79) stays;
// --xid without --simulate, or for a GPU the node lacks, is a usage
// error.
func TestReporterXID(t *testing.T) {
	for _, args := range [][]string{
		{"--xid", "0:94"},
		{"--simulate", "8xH100", "--xid", "8:94"},
		{"--simulate", "8xH100", "--xid", "0:94@later"},
		{"--simulate", "8xH100", "--health-every", "0s"},
	} {
		var errOut bytes.Buffer
		if code := ReporterMain(context.Background(), append(args, "--once"), &bytes.Buffer{}, &errOut); code != ExitUsage || errOut.Len() == 0 {
			t.Errorf("reporter %v: exit %d, stderr %q", args, code, errOut.String())
		}
	}

	addr := freeAddr(t)
	url := "nats://" + addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 2)
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--no-local-reporter",
			"--spec", "../../examples/disaggregate.yaml", "--settle", "-1s", "--log-level", "error"}, nil, &bytes.Buffer{}, &bytes.Buffer{})
	}()
	repErr := &syncWriter{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("reporter: %s", repErr.String())
		}
	})
	go func() {
		done <- ReporterMain(ctx, []string{"--server", url, "--simulate", "8xH100", "--node-id", "x1", "--heartbeat", "500ms",
			"--xid", "0:79@500ms", "--xid", "1:94@500ms", "--xid", "2:13@500ms", "--health-every", "1s", "--log-level", "error"}, &bytes.Buffer{}, repErr)
	}()
	defer func() { cancel(); <-done; <-done }()
	var nc *nats.Conn
	natstest.WaitFor(t, 20*time.Second, "the server up", func() bool {
		var err error
		nc, err = nats.Connect(url)
		return err == nil
	})
	defer nc.Close()
	js, _ := jetstream.New(nc)
	health := func() string {
		inv := store.NewInventoryStore(js)
		inv.NoCreate = true
		kv, err := inv.KV(ctx)
		if err != nil {
			return ""
		}
		e, err := kv.Get(ctx, "x1")
		var doc inventory.NodeInventory
		if err != nil || json.Unmarshal(e.Value(), &doc) != nil {
			return ""
		}
		var b strings.Builder
		for _, g := range doc.GPUs[:3] {
			fmt.Fprintf(&b, "%v ", g.Healthy)
		}
		return b.String()
	}
	natstest.WaitFor(t, 20*time.Second, "GPUs 0 and 1 unhealthy, 2 healthy (XID 13 is the application's)", func() bool {
		return health() == "false false true "
	})
	natstest.WaitFor(t, 20*time.Second, "GPU 1 healthy again, GPU 0 still not", func() bool { return health() == "false true true " })
}
