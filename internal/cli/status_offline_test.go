package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/natstest"
)

// TestJudgeServers: a server is offline on every stream once the
// streams together say so, quorum or not, whatever a stream's own view
// (a new leader that never heard from it, a stream without a leader,
// whose last-heard times are stale); one a leader heard lately, a
// leader, and the server that answered are alive.
func TestJudgeServers(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	peer := func(name string, current bool, active time.Duration) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: name, Current: current, Active: active, Lag: 23}
	}
	stream := func(name, leader string, since *time.Time, peers ...*jetstream.PeerInfo) streamStatus {
		ci := &jetstream.ClusterInfo{Leader: leader, LeaderSince: since, Replicas: peers}
		return streamStatus{Name: name, Leader: leader, Followers: followersOf(ci, now)}
	}
	cases := []struct {
		name    string
		streams []streamStatus
		// offline: per stream, the followers offline.
		offline [][]string
	}{
		{"a leader elected after the server died never heard from it", []streamStatus{
			stream("KV_poolplanner-inventory", "s0", ago(8*time.Second), peer("s1", true, 100*time.Millisecond), peer("s2", false, 0)),
			stream("POOLPLANNER_PLANS", "s1", ago(time.Second), peer("s0", true, 200*time.Millisecond), peer("s2", false, 0)),
		}, [][]string{{"s2"}, {"s2"}}},
		{"a leader just elected, a live follower not heard yet", []streamStatus{
			stream("KV_poolplanner-inventory", "s0", ago(time.Second), peer("s1", false, 0), peer("s2", true, 100*time.Millisecond)),
			stream("POOLPLANNER_PLANS", "s1", ago(time.Minute), peer("s0", true, 100*time.Millisecond), peer("s2", true, 200*time.Millisecond)),
		}, [][]string{nil, nil}},
		{"no quorum: the answering server alive, the others offline", []streamStatus{
			stream("KV_poolplanner-inventory", "", nil, peer("s0", true, 6500*time.Millisecond), peer("s1", false, 0), peer("s2", false, 0)),
			stream("KV_poolplanner-specs", "", nil, peer("s0", true, 6500*time.Millisecond), peer("s1", false, 9*time.Second), peer("s2", false, 0)),
		}, [][]string{{"s1", "s2"}, {"s1", "s2"}}},
		{"a stream mid-election: a server another leader hears is alive", []streamStatus{
			stream("KV_poolplanner-inventory", "", nil, peer("s0", true, 0), peer("s1", false, 0), peer("s2", false, 0)),
			stream("POOLPLANNER_PLANS", "s0", ago(time.Minute), peer("s1", true, 100*time.Millisecond), peer("s2", false, 7*time.Second)),
		}, [][]string{{"s2"}, {"s2"}}},
		{"a server back is alive where a leader heard it lately", []streamStatus{
			stream("KV_poolplanner-inventory", "s0", ago(time.Minute), peer("s1", true, 0), peer("s2", true, 300*time.Millisecond)),
			stream("POOLPLANNER_PLANS", "s0", ago(time.Minute), peer("s1", true, 100*time.Millisecond), peer("s2", false, 7*time.Second)),
		}, [][]string{nil, {"s2"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			judgeServers(c.streams)
			for i, s := range c.streams {
				var got []string
				for _, f := range s.Followers {
					if f.Offline {
						got = append(got, f.Name)
					}
				}
				if !slices.Equal(got, c.offline[i]) {
					t.Errorf("%s: offline %v, want %v", s.Name, got, c.offline[i])
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
