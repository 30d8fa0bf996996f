package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
)

// statusReport is what planner status says: the plan's latest revision,
// which planner leads it, and where NATS keeps the state.
type statusReport struct {
	Plan     string         `json:"plan"`
	Revision int            `json:"revision"`
	Valid    bool           `json:"valid"`
	Reason   string         `json:"reason,omitempty"`
	Error    string         `json:"error,omitempty"`
	At       *time.Time     `json:"published_at,omitempty"`
	Leader   *bus.Lease     `json:"leader"`
	Server   string         `json:"server"`
	Streams  []streamStatus `json:"streams"`
}

// streamStatus is one stream's replication: its Raft leader and how
// current each follower is.
type streamStatus struct {
	Name      string           `json:"name"`
	Replicas  int              `json:"replicas"`
	Messages  uint64           `json:"messages"`
	Leader    string           `json:"leader,omitempty"`
	Followers []followerStatus `json:"followers,omitempty"`
	Error     string           `json:"error,omitempty"`
}

type followerStatus struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	Lag     uint64 `json:"lag,omitempty"`
	// Seen is how long ago the stream's leader last heard from it.
	Seen time.Duration `json:"last_seen_ns"`
}

// statusStreams are the streams and buckets the planner keeps.
var statusStreams = []string{bus.InventoryStream, "KV_" + bus.SpecBucket, bus.PlansStream, client.AssignmentsStream, "OBJ_" + client.PlansBucket}

func newStatusCmd() *cobra.Command {
	var cf connFlags
	var plan, output string
	cmd := &cobra.Command{
		Use:   "status [--plan NAME] [--output text|json]",
		Short: "Show a plan's latest revision, the planner that leads it, and the replication of its state",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("status", nil, func(cmd *cobra.Command, _ []string) error {
			nc, js, err := cf.openPlan(plan, output)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			r, err := readStatus(ctx, js, plan)
			if err != nil {
				return err
			}
			r.Server = nc.ConnectedUrlRedacted()
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			return r.write(cmd.OutOrStdout(), time.Now())
		}),
	}
	cf.addPlanOutput(cmd, &plan, &output)
	return cmd
}

func readStatus(ctx context.Context, js jetstream.JetStream, plan string) (*statusReport, error) {
	r := &statusReport{Plan: plan}
	store := bus.NewPlanStore(js)
	rev, err := store.Client().Plan(ctx, plan, 0)
	switch {
	case errors.Is(err, client.ErrNotFound):
	case err != nil:
		r.Error = err.Error()
	default:
		d := rev.Document
		at := d.CreatedAt.UTC()
		r.Revision, r.Valid, r.Reason, r.Error, r.At = d.Revision, d.Valid, d.Reason, d.Error, &at
	}
	if _, err := js.Stream(ctx, bus.PlansStream); err == nil {
		if r.Leader, err = store.ReadLease(ctx, plan); err != nil {
			return nil, err
		}
	}
	for _, name := range statusStreams {
		r.Streams = append(r.Streams, streamOf(ctx, js, name))
	}
	return r, nil
}

func streamOf(ctx context.Context, js jetstream.JetStream, name string) streamStatus {
	s := streamStatus{Name: name}
	st, err := js.Stream(ctx, name)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	info := st.CachedInfo()
	s.Replicas, s.Messages = info.Config.Replicas, info.State.Msgs
	if info.Cluster != nil {
		s.Leader = info.Cluster.Leader
		for _, p := range info.Cluster.Replicas {
			s.Followers = append(s.Followers, followerStatus{Name: p.Name, Current: p.Current, Offline: p.Offline, Lag: p.Lag, Seen: p.Active})
		}
	}
	return s
}

func (r *statusReport) write(w io.Writer, now time.Time) error {
	switch {
	case r.At == nil && r.Error != "":
		fmt.Fprintf(w, "plan %s: unreadable: %s\n", r.Plan, r.Error)
	case r.At == nil:
		fmt.Fprintf(w, "plan %s: no revision yet\n", r.Plan)
	default:
		validity := "valid"
		if !r.Valid {
			validity = "INVALID: " + r.Error
		}
		fmt.Fprintf(w, "plan %s: revision %d, %s, published %s (%s ago)\n  reason: %s\n",
			r.Plan, r.Revision, validity, r.At.Format(time.RFC3339), now.Sub(*r.At).Round(time.Second), r.Reason)
	}
	if l := r.Leader; l != nil {
		fmt.Fprintf(w, "leader: planner %s on %s (pid %d), leading since %s, lease expires in %s unless renewed\n",
			l.Holder, l.Host, l.PID, l.Since.UTC().Format(time.RFC3339), l.Expires().Sub(now).Round(100*time.Millisecond))
	} else {
		fmt.Fprintln(w, "leader: none: no planner holds the lease (none runs, or a standby takes it within a second)")
	}
	fmt.Fprintf(w, "connected to %s\n", r.Server)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tREPLICAS\tMESSAGES\tLEADER\tFOLLOWERS")
	for _, s := range r.Streams {
		if s.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\n", s.Name, s.Error)
			continue
		}
		var fs []string
		for _, f := range s.Followers {
			state := "current"
			switch {
			case f.Offline:
				state = "OFFLINE"
			case !f.Current:
				state = fmt.Sprintf("catching up, %d behind", f.Lag)
			}
			if f.Seen > 2*time.Second {
				state += fmt.Sprintf(", last heard %s ago", f.Seen.Round(time.Second))
			}
			fs = append(fs, f.Name+" ("+state+")")
		}
		leader := s.Leader
		if leader == "" && s.Replicas > 1 {
			leader = "NONE (no quorum)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", s.Name, s.Replicas, s.Messages, leader, strings.Join(fs, ", "))
	}
	return tw.Flush()
}
