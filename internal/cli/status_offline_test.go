package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestJudgeServers: a server one stream shows offline is offline on
// every stream that has not heard from it lately, whatever that
// stream's own view (a new leader that never heard from it, a stream
// without a leader); one a leader heard from lately is alive on every
// stream.
func TestJudgeServers(t *testing.T) {
	f := func(name string, current, offline bool, seen time.Duration) followerStatus {
		return followerStatus{Name: name, Current: current, Offline: offline, Lag: 23, Seen: seen}
	}
	cases := []struct {
		name    string
		streams []streamStatus
		// want: per stream, per follower, offline.
		want [][]bool
	}{
		{"a new leader never heard from the dead server", []streamStatus{
			{Name: "KV_poolplanner-inventory", Leader: "s0", Followers: []followerStatus{f("s1", true, false, 100*time.Millisecond), f("s2", false, false, 0)}},
			{Name: "POOLPLANNER_PLANS", Leader: "s1", Followers: []followerStatus{f("s0", true, false, 200*time.Millisecond), f("s2", false, true, 12*time.Second)}},
		}, [][]bool{{false, true}, {false, true}}},
		{"no quorum: dead servers offline everywhere", []streamStatus{
			{Name: "KV_poolplanner-inventory", Followers: []followerStatus{f("s0", true, false, 0), f("s1", false, false, 0), f("s2", false, false, 9*time.Second)}},
			{Name: "KV_poolplanner-specs", Followers: []followerStatus{f("s0", true, false, 0), f("s1", false, false, 8*time.Second), f("s2", false, false, 0)}},
		}, [][]bool{{false, false, false}, {false, false, false}}},
		{"a server back is alive where a leader heard it", []streamStatus{
			{Name: "KV_poolplanner-inventory", Leader: "s0", Followers: []followerStatus{f("s1", true, false, 0), f("s2", true, false, 300*time.Millisecond)}},
			{Name: "POOLPLANNER_PLANS", Leader: "s0", Followers: []followerStatus{f("s1", true, false, 0), f("s2", false, true, 7*time.Second)}},
		}, [][]bool{{false, false}, {false, true}}},
	}
	// The no-quorum case: streamOf marks a replica unheard past
	// offlineAfter offline; do so here as it would.
	for i := range cases[1].streams {
		for j := range cases[1].streams[i].Followers {
			fl := &cases[1].streams[i].Followers[j]
			fl.Offline = fl.Seen > offlineAfter
		}
	}
	cases[1].want = [][]bool{{false, true, true}, {false, true, true}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			judgeServers(c.streams)
			for i, s := range c.streams {
				for j, fl := range s.Followers {
					if fl.Offline != c.want[i][j] {
						t.Errorf("%s: %s offline %v, want %v", s.Name, fl.Name, fl.Offline, c.want[i][j])
					}
				}
			}
		})
	}
}

// TestStatusOfflineEveryStream: on three `planner serve` processes
// with the state replicated, a server killed (kill -9: its peers get no
// word) is OFFLINE on every stream within a few heartbeats, and with two
// of three killed (no quorum) both are, on every stream: none shows a
// dead server catching up.
func TestStatusOfflineEveryStream(t *testing.T) {
	if testing.Short() {
		t.Skip("three serve processes")
	}
	dir := t.TempDir()
	routes := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var procs []*serveProc
	for i := range 3 {
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, "nats://"+r)
			}
		}
		args := []string{"--data-dir", filepath.Join(dir, strconv.Itoa(i)), "--server-name", fmt.Sprintf("s%d", i), "--replicas", "3",
			"--cluster-listen", routes[i], "--routes", strings.Join(others, ","), "--settle", "-1s"}
		if i == 0 {
			args = append(args, "--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100")
		}
		procs = append(procs, startServe(t, args...))
	}
	var last string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last status:\n%s", last)
		}
	})
	// status is nil while it fails: while the cluster forms, a server
	// may not know the streams yet.
	status := func() *statusReport {
		code, out, errOut := run(t, "status", "--server", procs[0].url, "-o", "json")
		last = out + errOut
		var r statusReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			return nil
		}
		return &r
	}
	// offlineEverywhere: every stream read lists each of dead as an
	// offline follower.
	offlineEverywhere := func(r *statusReport, dead ...string) bool {
		if r == nil {
			return false
		}
		read := 0
		for _, s := range r.Streams {
			if s.Error != "" {
				continue
			}
			read++
			for _, name := range dead {
				listed := false
				for _, f := range s.Followers {
					if f.Name == name {
						listed = true
						if !f.Offline {
							return false
						}
					}
				}
				if !listed {
					return false
				}
			}
		}
		return read > 0
	}
	natstest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "a valid plan and a leader", func() bool {
		r := status()
		return r != nil && r.Valid && r.Leader != nil
	})
	for _, dead := range [][]string{{"s2"}, {"s2", "s1"}} {
		p := procs[3-len(dead)] // s2, then s1
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		killed := time.Now()
		// offlineAfter unheard, and the seconds a loaded machine takes
		// to elect new stream leaders.
		natstest.WaitEvery(t, offlineAfter+25*time.Second, 200*time.Millisecond, fmt.Sprintf("%v offline on every stream", dead), func() bool {
			return offlineEverywhere(status(), dead...)
		})
		t.Logf("%v offline on every stream %s after kill -9", dead, time.Since(killed).Round(100*time.Millisecond))
		for range 3 { // and it stays so
			if r := status(); !offlineEverywhere(r, dead...) {
				t.Fatalf("%v not offline on every stream again", dead)
			}
		}
	}
}
