package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// drainRoles may drain and undrain: an admin, and the planner's own
// credentials (which hold every permission of its account).
var drainRoles = []auth.Role{auth.Admin, auth.Planner}

// listRoles may list the drains (drain --list): the readers too, as
// they may read the bucket (a reporter may read only its own inventory
// key).
var listRoles = []auth.Role{auth.Launcher, auth.Admin, auth.Planner}

func newDrainCmd() *cobra.Command {
	var cf connFlags
	var reason, deadline, output string
	var list bool
	var drain func(*cobra.Command, []string) error
	cmd := &cobra.Command{
		Use:   "drain NODE_ID[:GPU_INDEX]... [--reason TEXT] [--deadline D] | drain --list",
		Short: "Take nodes or GPUs out of placement: their workers move off, nothing new lands there",
		Long: `drain takes each node (NODE_ID) or GPU (NODE_ID:GPU_INDEX) out of
placement: the planner moves the workers there off in one revision (the
others stay where they are; where there is no room elsewhere the plan is
degraded and says the drain is why) and places nothing new there until
planner undrain puts it back. The drain is stored in the planner's drain
bucket, so it holds across planner restarts and failovers, with who drained
it, when and why (--reason).

--deadline lets the workers stay until then (a duration from now, such as
30m, or an RFC 3339 time), so that a job can reach a checkpoint; until it
passes nothing new lands there and the plan's revisions say the workers are
leaving. Without it they leave at once.

drain --list lists what is drained now (operators' drains, and GPUs the
planner holds out because they kept turning unhealthy, and nodes whose
reporter kept vanishing).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if list {
				return cf.wrap("listing the drains", listRoles, func(cmd *cobra.Command, args []string) error {
					if len(args) > 0 || reason != "" || deadline != "" {
						return usagef("--list takes no NODE_ID, --reason or --deadline")
					}
					return listDrains(cmd, &cf, output)
				})(cmd, args)
			}
			return cf.wrap("draining", drainRoles, drain)(cmd, args)
		},
	}
	drain = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usagef("drain: name at least one NODE_ID or NODE_ID:GPU_INDEX (or --list)")
		}
		if len(reason) > store.MaxDrainReason {
			return usagef("--reason: %d bytes; at most %d allowed", len(reason), store.MaxDrainReason)
		}
		now := time.Now().UTC()
		var until *time.Time
		if deadline != "" {
			t, err := parseDeadline(deadline, now)
			if err != nil {
				return usageError{err}
			}
			until = &t
		}
		drains := make([]store.Drain, len(args))
		by, role := who(&cf)
		for i, a := range args {
			node, gpu, err := store.ParseTarget(a)
			if err != nil {
				return usagef("drain: %v", err)
			}
			drains[i] = store.Drain{NodeID: node, GPU: gpu, Cause: plan.DrainOperator, Reason: reason, Deadline: until, By: by, Role: role, At: now}
		}
		_, js, err := cf.dial()
		if err != nil {
			return err
		}
		defer cf.nc.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
		defer cancel()
		if err := checkTargets(ctx, cmd, js, drains); err != nil {
			return err
		}
		ds := store.NewDrainStore(js)
		ds.NoCreate = true // the planner makes it at start
		for _, d := range drains {
			if err := ds.Put(ctx, d); err != nil {
				return noDrainBucket(err)
			}
			when := "its workers move off now"
			if until != nil {
				when = "its workers leave at " + until.Format(time.RFC3339)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "drained %s: %s\n", d.Target(), when)
		}
		return nil
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&reason, "reason", "", "why (kept with the drain, said in the plans' revisions)")
	cmd.Flags().StringVar(&deadline, "deadline", "", "let the workers stay until then: a duration from now (30m) or an RFC 3339 time (default: at once)")
	cmd.Flags().BoolVar(&list, "list", false, "list what is drained now")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "--list output format: text or json")
	return cmd
}

func newUndrainCmd() *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{
		Use:   "undrain NODE_ID[:GPU_INDEX]...",
		Short: "Put drained nodes or GPUs back into placement: nobody moves",
		Long: `undrain ends the drain of each node or GPU (also a GPU the planner held
out for flapping): new placements, and the unplaced workers of degraded
plans, may use it again; placed workers stay where they are. Who undrained
it and when is kept in the drain bucket's history.`,
		Args: cobra.MinimumNArgs(1),
		RunE: cf.wrap("undraining", drainRoles, func(cmd *cobra.Command, args []string) error {
			type target struct {
				node string
				gpu  *int
			}
			targets := make([]target, len(args))
			for i, a := range args {
				node, gpu, err := store.ParseTarget(a)
				if err != nil {
					return usagef("undrain: %v", err)
				}
				targets[i] = target{node, gpu}
			}
			_, js, err := cf.dial()
			if err != nil {
				return err
			}
			defer cf.nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			ds := store.NewDrainStore(js)
			ds.NoCreate = true // the planner makes it at start
			by, role := who(&cf)
			for i, t := range targets {
				err := ds.Undrain(ctx, t.node, t.gpu, by, role, time.Now())
				if errors.Is(err, client.ErrNotFound) {
					return fmt.Errorf("%s is not drained (planner drain --list)", args[i])
				}
				if err != nil {
					return noDrainBucket(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "undrained %s\n", args[i])
			}
			return nil
		}),
	}
	cf.add(cmd.Flags())
	return cmd
}

// checkTargets refuses a GPU index the node's inventory lacks, and
// warns of a node not in the inventory (it is drained when it reports).
// An inventory that cannot be read checks nothing.
func checkTargets(ctx context.Context, cmd *cobra.Command, js jetstream.JetStream, drains []store.Drain) error {
	inv := store.NewInventoryStore(js)
	inv.NoCreate = true
	for _, d := range drains {
		doc, _, err := inv.Get(ctx, d.NodeID)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			fmt.Fprintf(cmd.ErrOrStderr(), "planner: warning: node %s is not in the inventory: it is drained when it reports\n", d.NodeID)
		case err != nil:
			return nil
		case d.GPU != nil && *d.GPU >= len(doc.GPUs):
			return usagef("drain %s: node %s has %d GPUs (0 to %d)", d.Target(), d.NodeID, len(doc.GPUs), len(doc.GPUs)-1)
		}
	}
	return nil
}

// parseDeadline reads --deadline: a duration from now, or an RFC 3339
// time, which must not have passed.
func parseDeadline(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		if !t.After(now) {
			return time.Time{}, fmt.Errorf("--deadline: %s has passed; want a later time, or none to drain at once", s)
		}
		return t.UTC(), nil
	}
	d, err := parseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--deadline: %q: want a duration from now (30m, 2h) or an RFC 3339 time (2026-01-02T15:04:05Z)", s)
	}
	return now.Add(d).Truncate(time.Second), nil
}

// who says who runs the command, for the drain's audit: the OS user and
// host, and the credentials' role where they name one.
func who(cf *connFlags) (by, role string) {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	if id, err := cf.sec.Identity(); err == nil && id.Role != "" {
		role = string(id.Role)
	}
	return name + "@" + host, role
}

// drainListing is one line of drain --list.
type drainListing struct {
	Target   string     `json:"target"`
	NodeID   string     `json:"node_id"`
	GPU      *int       `json:"gpu,omitempty"`
	Cause    string     `json:"cause"`
	Reason   string     `json:"reason,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
	Leaving  bool       `json:"leaving,omitempty"`
	By       string     `json:"by"`
	Role     string     `json:"role,omitempty"`
	At       time.Time  `json:"at"`
}

func listDrains(cmd *cobra.Command, cf *connFlags, output string) error {
	if output != "text" && output != "json" {
		return usagef("--output: %q is not allowed; want text or json", output)
	}
	_, js, err := cf.dial()
	if err != nil {
		return err
	}
	defer cf.nc.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
	defer cancel()
	ds := store.NewDrainStore(js)
	ds.NoCreate = true // read-only: a bare server stays bare
	drains, bad, err := ds.List(ctx)
	if errors.Is(err, store.ErrNoDrainBucket) {
		// A planner older than drains made the rest of the state: then
		// nothing is drained; on a server without any, say so.
		if _, serr := js.Stream(ctx, client.PlansStream); errors.Is(serr, jetstream.ErrStreamNotFound) {
			return noState(err)
		}
		drains, err = nil, nil
	}
	if err != nil {
		return busErr(err)
	}
	for _, e := range bad {
		fmt.Fprintf(cmd.ErrOrStderr(), "planner: warning: %v\n", e)
	}
	out := listings(drains, time.Now())
	if output == "json" {
		return writeJSON(cmd.OutOrStdout(), out)
	}
	return writeDrains(cmd.OutOrStdout(), out)
}

// noDrainBucket is a drain's or undrain's error: a missing drain
// bucket is said as what it is (no planner made it) rather than made
// here, where it would start without the planner's settings.
func noDrainBucket(err error) error {
	if errors.Is(err, store.ErrNoDrainBucket) {
		return fmt.Errorf("%w; planner serve makes it at start: start the planner against this server first", err)
	}
	return busErr(err)
}

// listings are drains as drain --list and status show them, in the
// natural order of their targets.
func listings(drains []store.Drain, now time.Time) []drainListing {
	out := make([]drainListing, len(drains))
	for i, d := range drains {
		out[i] = drainListing{Target: d.Target(), NodeID: d.NodeID, GPU: d.GPU, Cause: d.Cause, Reason: d.Reason, Deadline: d.Deadline,
			Leaving: d.Deadline != nil && now.Before(*d.Deadline), By: d.By, Role: d.Role, At: d.At}
	}
	slices.SortFunc(out, func(a, b drainListing) int { return plan.CompareNodeIDs(a.Target, b.Target) })
	return out
}

// readDrains reads the drains in force for status.
func (r *statusReport) readDrains(ctx context.Context, js jetstream.JetStream) {
	ds := store.NewDrainStore(js)
	ds.NoCreate = true
	drains, bad, err := ds.List(ctx)
	r.Drained = listings(drains, time.Now())
	switch {
	case errors.Is(err, store.ErrNoDrainBucket):
	case err != nil:
		r.unavailable("the drains: %v", err)
	case len(bad) > 0:
		r.unavailable("%d drain records that do not decode, the first: %v", len(bad), bad[0])
	}
}

// writeDrained lists the drained nodes and GPUs, if any.
func (r *statusReport) writeDrained(w io.Writer) {
	if len(r.Drained) == 0 {
		return
	}
	fmt.Fprintf(w, "drained (%d):\n", len(r.Drained))
	var b strings.Builder
	_ = writeDrains(&b, r.Drained)
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		fmt.Fprintf(w, "  %s\n", line)
	}
}

func writeDrains(w io.Writer, ds []drainListing) error {
	if len(ds) == 0 {
		_, err := fmt.Fprintln(w, "nothing drained")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tCAUSE\tSTATE\tBY\tAT\tREASON")
	for _, d := range ds {
		state := "out"
		if d.Leaving {
			state = "leaving at " + d.Deadline.UTC().Format(time.RFC3339)
		}
		by := d.By
		if d.Role != "" {
			by += " (" + d.Role + ")"
		}
		reason := d.Reason
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Target, d.Cause, state, by, d.At.UTC().Format(time.RFC3339), reason)
	}
	return tw.Flush()
}
