package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestHAStartQuiet: three `planner serve` started together as the
// README's HA recipe on one machine (their routes not up yet, no meta
// leader for a while) reach a plan without a warning or an error logged:
// what a cluster forming always does is logged at info.
func TestHAStartQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("three clustered servers")
	}
	dir := t.TempDir()
	clients := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	routes := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	logs := make([]*syncWriter, 3)
	for i := range 3 {
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, "nats://"+r)
			}
		}
		args := []string{"--listen", clients[i], "--cluster-listen", routes[i], "--routes", strings.Join(others, ","),
			"--server-name", fmt.Sprintf("s%d", i), "--replicas", "3", "--data-dir", filepath.Join(dir, fmt.Sprint(i)),
			"--no-local-reporter", "--settle", "-1s", "--log-level", "info"}
		if i == 0 {
			args = append(args, "--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100")
		}
		logs[i], _ = runServe(t, args...)
	}
	server := "nats://" + clients[0]
	natstest.WaitEvery(t, 90*time.Second, 250*time.Millisecond, "a valid plan, every stream's replicas current", func() bool {
		code, out, _ := run(t, "status", "--server", server, "-o", "json")
		var r statusReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil || !r.Valid || r.Leader == nil || len(r.Streams) == 0 {
			return false
		}
		for _, s := range r.Streams {
			if s.Error != "" || s.Leader == "" || len(s.Followers) != 2 {
				return false
			}
			for _, f := range s.Followers {
				if !f.Current {
					return false
				}
			}
		}
		return true
	})
	for i, l := range logs {
		for _, line := range strings.Split(l.String(), "\n") {
			var entry struct {
				Level string `json:"level"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && (entry.Level == "warn" || entry.Level == "error") {
				t.Errorf("serve s%d: %s", i, line)
			}
		}
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("LOG s%d:\n%s", i, l.String())
		}
	}
}
