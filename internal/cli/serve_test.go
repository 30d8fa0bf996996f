package cli

import (
	"strings"
	"testing"
)

// TestServeClusterFlags: the cluster and replica flags that cannot work
// are refused at once, with exit 2 and the flag named.
func TestServeClusterFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas 0: must be 1 to 5"},
		{[]string{"--replicas", "7"}, "--replicas 7: must be 1 to 5"},
		{[]string{"--replicas", "3"}, "--replicas 3: the embedded server needs --cluster-listen and --routes naming at least 2 other servers"},
		{[]string{"--replicas", "3", "--cluster-listen", "127.0.0.1:6222", "--routes", "nats://127.0.0.1:6223"}, "at least 2 other servers"},
		{[]string{"--routes", "nats://127.0.0.1:6223"}, "--routes needs --cluster-listen"},
		{[]string{"--cluster-listen", "6222"}, `--cluster-listen "6222": want HOST:PORT`},
		{[]string{"--cluster-listen", "127.0.0.1:6222", "--routes", "127.0.0.1:6223"}, `--routes "127.0.0.1:6223": want nats://HOST:PORT`},
		{[]string{"--server", "nats://127.0.0.1:4222", "--cluster-listen", "127.0.0.1:6222"}, "not with --server"},
		{[]string{"--cluster-listen", "0.0.0.0:6222"}, "add --auth"},
		{[]string{"--lease-ttl", "100ms"}, "--lease-ttl 100ms: must be 1s to 1h"},
	}
	for _, c := range cases {
		args := append([]string{"serve", "--no-local-reporter"}, c.args...)
		code, _, errOut := run(t, args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("planner %s: exit %d, %q; want exit %d and %q", strings.Join(args, " "), code, errOut, ExitUsage, c.want)
		}
	}
}
