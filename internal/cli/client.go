package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// requestTimeout bounds one request of a client command.
const requestTimeout = 10 * time.Second

// clientCommands are the commands that talk to a running `planner serve`.
func clientCommands() []*cobra.Command {
	return []*cobra.Command{newValidateCmd(), newLookupCmd(), newWatchCmd(), newHistoryCmd(), newSpecCmd(), newStatusCmd(), newDrainCmd(), newUndrainCmd()}
}

func defaultServer() string { return "nats://" + DefaultListen }

// busErr turns a bad-request reply into a usage error (exit 2).
func busErr(err error) error {
	if errors.Is(err, client.ErrBadRequest) {
		return usageError{err}
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newValidateCmd() *cobra.Command {
	var cf connFlags
	var specPath, output, plan string
	cmd := &cobra.Command{
		Use:   "validate --spec FILE [--plan NAME] [--server URL]",
		Short: "Validate a job spec as plan NAME's against what the live inventory leaves it, without publishing",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("validate", nil, func(cmd *cobra.Command, _ []string) error {
			body, src, err := validateRequest(specPath, output, plan)
			if err != nil {
				return err
			}
			nc, _, err := cf.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			c, err := client.New(nc)
			if err != nil {
				return err
			}
			reply, err := c.ValidateAs(ctx, plan, body)
			if err != nil {
				return busErr(err)
			}
			if output == "text" {
				writeSpecNotes(cmd.OutOrStdout(), specPath, src)
			}
			return writeValidation(cmd, reply, output)
		}),
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&specPath, "spec", "", "job spec, YAML or JSON, or a rlightning job or cluster config")
	cmd.Flags().StringVar(&plan, "plan", "", "the plan the spec is for (default: a new plan): its own GPUs are not in its way, those of other plans of its priority or higher are")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

// validateRequest checks validate's flags and reads the spec as the JSON
// the service takes (a YAML spec as its JSON form; a rlightning config as
// the poolplanner spec it stands for).
func validateRequest(specPath, output, plan string) ([]byte, *planner.SpecSource, error) {
	if specPath == "" {
		return nil, nil, usagef("validate needs --spec FILE")
	}
	if !validOutput(output) {
		return nil, nil, usagef("--output: %q is not allowed; want text, json or yaml", output)
	}
	if plan != "" {
		if err := store.ValidatePlanName(plan); err != nil {
			return nil, nil, usagef("--plan: %v", err)
		}
	}
	src, err := loadSpec(specPath)
	if err != nil {
		return nil, nil, err
	}
	body, err := specJSON(src.Native)
	if err != nil {
		return nil, nil, usagef("--spec %s: %v", specPath, err)
	}
	return body, src, nil
}

// writeValidation prints a validate reply as planner plan prints a plan,
// and exits 1 when it is not valid.
func writeValidation(cmd *cobra.Command, reply *client.ValidateReply, output string) error {
	if reply.Document == nil {
		return fmt.Errorf("validate: the reply has no plan")
	}
	if !reply.Valid() && output == "yaml" {
		// As planner plan: no resource_pool to print.
		fmt.Fprintln(cmd.ErrOrStderr(), "planner: not valid on the live inventory: "+reply.Error)
		return exitError{ExitInvalid}
	}
	if err := writePlan(cmd.OutOrStdout(), &planner.Plan{Document: *reply.Document}, output); err != nil {
		return err
	}
	if !reply.Valid() {
		if output == "text" {
			fmt.Fprintln(cmd.ErrOrStderr(), "planner: not valid on the live inventory: "+reply.Error)
		}
		return exitError{ExitInvalid}
	}
	return nil
}

func newLookupCmd() *cobra.Command {
	var cf connFlags
	var plan, node string
	var revision int
	cmd := &cobra.Command{
		Use:   "lookup COMPONENT INDEX | lookup --node ID",
		Short: "Where a worker runs: node, GPUs, GPU UUIDs and CUDA_VISIBLE_DEVICES",
		Args:  cobra.MaximumNArgs(2),
		RunE: cf.wrap("lookup", nil, func(cmd *cobra.Command, args []string) error {
			req := wire.LookupRequest{Plan: plan, NodeID: node, Revision: revision}
			switch {
			case node != "" && len(args) > 0:
				return usagef("lookup takes COMPONENT INDEX or --node ID, not both")
			case node == "" && len(args) != 2:
				return usagef("lookup needs COMPONENT INDEX, or --node ID")
			case node == "":
				i, err := strconv.Atoi(args[1])
				if err != nil || i < 0 {
					return usagef("INDEX %q: want a whole number >= 0", args[1])
				}
				req.Component, req.Index = args[0], &i
			}
			nc, _, err := cf.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			if node != "" {
				var reply client.Assignment
				if err := bus.Request(ctx, nc, client.LookupSubject, req, &reply); err != nil {
					return busErr(err)
				}
				return writeJSON(cmd.OutOrStdout(), reply)
			}
			var reply client.PlacedWorker
			if err := bus.Request(ctx, nc, client.LookupSubject, req, &reply); err != nil {
				return busErr(err)
			}
			return writeJSON(cmd.OutOrStdout(), reply)
		}),
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&plan, "plan", "default", "plan name")
	cmd.Flags().StringVar(&node, "node", "", "list every worker of this node")
	cmd.Flags().IntVar(&revision, "revision", 0, "plan revision (default the latest)")
	return cmd
}

func newWatchCmd() *cobra.Command {
	var cf connFlags
	var plan, node, output string
	cmd := &cobra.Command{
		Use:   "watch [--plan NAME] [--node NODE_ID] [--server URL]",
		Short: "Follow plan revisions, or one node's assignments, as they are published",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("watch", nil, func(cmd *cobra.Command, _ []string) error {
			if !validOutput(output) {
				return usagef("--output: %q is not allowed; want text, json or yaml", output)
			}
			if node != "" {
				if err := inventory.ValidateNodeID(node); err != nil {
					return usagef("--node: %v", err)
				}
			}
			if plan != "" {
				if err := store.ValidatePlanName(plan); err != nil {
					return usagef("--plan: %v", err)
				}
			}
			nc, _, err := cf.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := client.New(nc)
			if err != nil {
				return err
			}
			if node != "" {
				if err := watchNode(cmd, c, plan, node, output); err != nil {
					return err
				}
				return watchEnded(cmd, nc)
			}
			ch, err := c.Follow(cmd.Context(), plan, client.FollowOptions{})
			if err != nil {
				return err
			}
			for r := range ch {
				if output == "text" {
					fmt.Fprintf(cmd.OutOrStdout(), "--- %s\n", r.Document.CreatedAt.Format(time.RFC3339))
				}
				if err := writePlan(cmd.OutOrStdout(), &planner.Plan{Document: *r.Document}, output); err != nil {
					return err
				}
			}
			return watchEnded(cmd, nc)
		}),
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&plan, "plan", "default", "plan name")
	cmd.Flags().StringVar(&node, "node", "", "follow only this node's assignments (poolplanner.assignments.PLAN.NODE_ID)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

// watchEnded is why a watch ended before it was asked to (the
// command's context, an interrupt): the connection refused (credentials
// expired or withdrawn) or lost for good; nil when asked.
func watchEnded(cmd *cobra.Command, nc *nats.Conn) error {
	if cmd.Context().Err() != nil {
		return nil
	}
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("the watch ended: %w", err)
	}
	return errors.New("the watch ended: the connection to NATS closed")
}

// watchNode prints a node's assignment as it is now and at every change:
// in text a line per worker, else the assignment message.
func watchNode(cmd *cobra.Command, c *client.Client, plan, node, output string) error {
	if err := inventory.ValidateNodeID(node); err != nil {
		return usageError{fmt.Errorf("--node: %w", err)}
	}
	if _, err := c.Assignment(cmd.Context(), plan, node); errors.Is(err, client.ErrNotFound) {
		fmt.Fprintf(cmd.ErrOrStderr(), "node %s has had no workers in plan %s; waiting for its first assignment\n", node, plan)
	}
	ch, err := c.FollowNode(cmd.Context(), plan, node)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	for a := range ch {
		switch output {
		case "json":
			if err := json.NewEncoder(out).Encode(a); err != nil {
				return err
			}
		case "yaml":
			b, _ := yaml.Marshal(a)
			fmt.Fprintf(out, "---\n%s", b)
		default:
			fmt.Fprintf(out, "--- plan %s revision %d: %s, %d %s\n", a.Plan, a.Revision, a.NodeID, len(a.Workers), plural(len(a.Workers), "worker", "workers"))
			for _, w := range a.Workers {
				fmt.Fprintf(out, "  %-6s %-4d gpus %v  cpus %v  CUDA_VISIBLE_DEVICES=%s\n", w.Component, w.Index, w.GPUs, w.CPUs, w.CUDAVisibleDevices)
			}
		}
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// historyEntry is one revision in `planner history --output json`.
type historyEntry struct {
	Revision  int       `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	Valid     bool      `json:"valid"`
	Reason    string    `json:"reason"`
	Moved     int       `json:"moved"`
	Error     string    `json:"error,omitempty"`
	// Kind and Base say how the revision's event carries its placement;
	// Seq is the event's stream sequence.
	Kind string `json:"kind"`
	Base int    `json:"base"`
	Seq  uint64 `json:"seq"`
}

func newHistoryCmd() *cobra.Command {
	var cf connFlags
	var plan, output string
	cmd := &cobra.Command{
		Use:   "history [--plan NAME] [--output text|json]",
		Short: "List every revision of a plan the stream keeps, for audit",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("history", nil, func(cmd *cobra.Command, _ []string) error {
			nc, _, err := cf.openPlan(plan, output)
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := client.New(nc)
			if err != nil {
				return err
			}
			entries := []historyEntry{}
			err = c.History(cmd.Context(), plan, func(i client.Info) bool {
				entries = append(entries, historyEntry{i.Revision, i.Time.UTC(), i.Valid, i.Reason, i.Moved, i.Error, i.Kind, i.Base, i.Seq})
				return true
			})
			switch {
			case errors.Is(err, client.ErrNotFound):
				return noState(err)
			case err == nil && len(entries) == 0:
				return fmt.Errorf("plan %s has no revision in stream %s (planner status lists the plans)", plan, client.PlansStream)
			}
			if err != nil {
				// The stream unreadable (no quorum, say): what the planner
				// holds, its latest revision, and a word that the rest is
				// not there.
				rctx, cancel := context.WithTimeout(cmd.Context(), statusPartTimeout)
				defer cancel()
				d, rerr := c.RequestPlan(rctx, plan, 0)
				if rerr != nil {
					return fmt.Errorf("read the history: %w (nor does the planner answer: %v)", err, rerr)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "history unavailable: %v; the planner's latest revision only\n", err)
				entries = []historyEntry{{Revision: d.Revision, CreatedAt: d.CreatedAt.UTC(), Valid: d.Valid(), Reason: d.Reason, Moved: d.Moved, Error: d.Error}}
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), entries)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REVISION\tTIME\tVALID\tMOVED\tREASON")
			for _, e := range entries {
				fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%s\n", e.Revision, e.CreatedAt.Format(time.RFC3339), e.Valid, e.Moved, e.Reason)
			}
			return tw.Flush()
		}),
	}
	cf.addPlanOutput(cmd, &plan, &output)
	return cmd
}

func newSpecCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "spec", Short: "Read or change a plan's stored spec"}
	var cf connFlags
	var plan string
	var force bool
	var wait time.Duration
	set := &cobra.Command{
		Use:   "set --plan NAME FILE",
		Short: "Store FILE as the plan's spec, if it can be placed now; the planner replans on it",
		Long: `spec set stores FILE as plan NAME's spec, and the planner replans on it.
It first asks the planner to validate FILE as NAME's spec on the live
inventory (as planner validate --plan NAME does: the plan's own GPUs are
not in its way), and refuses a spec that cannot be placed now (exit 1,
the reason as validate gives it; nothing stored), or one no planner
validates (none is serving: it waits --wait, 10s, for one to answer, as
a planner just started takes a few seconds). --force stores it anyway,
and says so. FILE may be a rlightning job or cluster config: the
poolplanner spec it stands for is validated and stored (planner spec
convert FILE prints it).`,
		Args: cobra.ExactArgs(1),
		RunE: cf.wrap("setting a spec", []auth.Role{auth.Admin, auth.Planner}, func(cmd *cobra.Command, args []string) error {
			src, err := loadSpec(args[0])
			if err != nil {
				return err
			}
			data := src.Native
			body, err := specJSON(data)
			if err != nil {
				return usagef("%s: %v", args[0], err)
			}
			if wait < 0 {
				return usagef("--wait %s: must be >= 0", wait)
			}
			nc, js, err := cf.dialPlan(plan)
			if err != nil {
				return err
			}
			defer nc.Close()
			warning, err := checkSpecSet(cmd, nc, plan, body, force, wait)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			rev, err := store.NewSpecStore(js).Put(ctx, plan, data)
			if err != nil {
				return busErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "spec of plan %s stored (spec revision %d)\n", plan, rev)
			writeSpecNotes(cmd.OutOrStdout(), args[0], src)
			if warning != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "planner: warning: plan %s: %s\n", plan, warning)
			}
			return nil
		}),
	}
	cf.add(set.Flags())
	set.Flags().StringVar(&plan, "plan", "default", "plan name")
	set.Flags().BoolVar(&force, "force", false, "store the spec even if it cannot be placed now, or no planner validates it")
	durationVar(set.Flags(), &wait, "wait", 10*time.Second, "how long to wait for a planner to answer the validation (one just started takes a few seconds)")
	cmd.AddCommand(set, newSpecGetCmd(), newSpecRmCmd(), newSpecLsCmd(), newSpecConvertCmd())
	return cmd
}

// checkSpecSet validates spec (JSON) as plan's new spec through the
// service, before spec set stores it. A spec the service cannot read is
// a usage error (exit 2), forced or not. One that cannot be placed now,
// or that no planner validates, is refused (exit 1, the reason on
// stderr) unless force; forced, the returned warning says what was not
// right.
func checkSpecSet(cmd *cobra.Command, nc *nats.Conn, plan string, spec []byte, force bool, wait time.Duration) (warning string, err error) {
	c, err := client.New(nc)
	if err != nil {
		return "", err
	}
	reply, err := validateWaiting(cmd.Context(), c, plan, spec, wait)
	switch {
	case errors.Is(err, client.ErrBadRequest):
		return "", usageError{err}
	case err != nil && cmd.Context().Err() != nil:
		return "", err
	case err != nil && force:
		why := err.Error()
		if errors.Is(err, nats.ErrNoResponders) {
			why = "no planner answers " + client.ValidateSubject
		}
		return "stored without validation (--force): " + why, nil
	case errors.Is(err, nats.ErrNoResponders):
		fmt.Fprintf(cmd.ErrOrStderr(), "planner: spec of plan %s not stored: no planner answers %s to validate it, waited %s (is `planner serve` running?); --force stores it unvalidated\n",
			plan, client.ValidateSubject, wait)
		return "", exitError{ExitInvalid}
	case err != nil:
		// A timeout or a refusal: wrap's Explain says which.
		return "", fmt.Errorf("spec of plan %s not stored: validating it: %w (--force stores it unvalidated)", plan, err)
	case reply.Document == nil:
		return "", fmt.Errorf("validate: the reply has no plan")
	case reply.Valid():
		return "", nil
	case force:
		return "stored (--force), but it cannot be placed now: " + reply.Error, nil
	}
	w := cmd.ErrOrStderr()
	fmt.Fprintf(w, "planner: spec of plan %s not stored: it cannot be placed now: %s\n", plan, reply.Error)
	if len(reply.Explanations) > 0 {
		fmt.Fprintln(w, "why")
		for _, x := range reply.Explanations {
			for _, line := range strings.Split(strings.TrimSuffix(x.Text(), "\n"), "\n") {
				fmt.Fprintf(w, "  %s\n", line)
			}
		}
	}
	fmt.Fprintf(w, "(planner validate --plan %s --spec FILE shows the plan it would get; --force stores it anyway)\n", plan)
	return "", exitError{ExitInvalid}
}

func newSpecGetCmd() *cobra.Command {
	var cf connFlags
	var plan, output string
	get := &cobra.Command{
		Use:   "get --plan NAME [--output yaml|json]",
		Short: "Print the plan's stored spec: as stored (yaml, comments kept), or as JSON",
		Long: `spec get prints plan NAME's stored spec on stdout: --output yaml (the
default) prints it byte for byte as it was stored (a JSON spec stays
JSON), --output json as JSON. Its spec revision and when it was stored
go to stderr. A plan with no spec, or a server where no planner ever
ran, is an error (exit 1).`,
		Args: cobra.NoArgs,
		RunE: cf.wrap("reading a spec", []auth.Role{auth.Admin, auth.Planner}, func(cmd *cobra.Command, _ []string) error {
			if output != "yaml" && output != "json" {
				return usagef("--output: %q is not allowed; want yaml or json", output)
			}
			nc, js, err := cf.dialPlan(plan)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			specs := store.NewSpecStore(js)
			specs.NoCreate = true
			e, err := specs.Entry(ctx, plan)
			if errors.Is(err, store.ErrNoSpecBucket) {
				return fmt.Errorf("no poolplanner state on this server: %w", err)
			}
			if errors.Is(err, client.ErrNotFound) {
				return fmt.Errorf("plan %s has no spec (planner spec ls lists the plans)", plan)
			}
			if err != nil {
				return busErr(err)
			}
			out := e.Spec
			if output == "json" {
				if out, err = specJSON(e.Spec); err != nil {
					return fmt.Errorf("plan %s's stored spec (spec revision %d) does not parse: %w; --output yaml prints it as stored", plan, e.Revision, err)
				}
				out = append(out, '\n')
			}
			if _, err := cmd.OutOrStdout().Write(out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "plan %s: spec revision %d, stored %s\n", plan, e.Revision, e.Updated.UTC().Format(time.RFC3339))
			return nil
		}),
	}
	cf.add(get.Flags())
	get.Flags().StringVar(&plan, "plan", "default", "plan name")
	get.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml (as stored) or json")
	return get
}

// validateWaiting asks the planners to validate spec as plan's, and
// while none answers (none subscribed yet: one just started, as right
// after planner serve) asks again, for wait at most.
func validateWaiting(ctx context.Context, c *client.Client, plan string, spec []byte, wait time.Duration) (*client.ValidateReply, error) {
	deadline := time.Now().Add(wait)
	for {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		reply, err := c.ValidateAs(rctx, plan, spec)
		cancel()
		if !errors.Is(err, nats.ErrNoResponders) || !time.Now().Before(deadline) {
			return reply, err
		}
		t := time.NewTimer(min(250*time.Millisecond, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func newSpecRmCmd() *cobra.Command {
	var cf connFlags
	var plan string
	rm := &cobra.Command{
		Use:   "rm --plan NAME",
		Short: "Remove the plan's spec: the planner releases its workers and its last revision says so",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("removing a spec", []auth.Role{auth.Admin, auth.Planner}, func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("plan") {
				return usagef("--plan: name the plan whose spec to remove (planner spec ls lists them)")
			}
			nc, js, err := cf.dialPlan(plan)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			specs := store.NewSpecStore(js)
			specs.NoCreate = true
			if err := specs.Delete(ctx, plan); err != nil {
				if errors.Is(err, store.ErrNoSpecBucket) {
					return fmt.Errorf("no poolplanner state on this server: %w", err)
				}
				if errors.Is(err, client.ErrNotFound) {
					return fmt.Errorf("plan %s has no spec (planner spec ls lists the plans)", plan)
				}
				return busErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "spec of plan %s removed; the planner releases its workers in the plan's last revision\n", plan)
			return nil
		}),
	}
	cf.add(rm.Flags())
	rm.Flags().StringVar(&plan, "plan", "", "plan name (required)")
	return rm
}

// specListing is one line of planner spec ls.
type specListing struct {
	Plan         string    `json:"plan"`
	Priority     int       `json:"priority"`
	MaxGPUs      int       `json:"max_gpus,omitempty"`
	SpecRevision uint64    `json:"spec_revision"`
	Updated      time.Time `json:"updated"`
	Error        string    `json:"error,omitempty"`
}

func newSpecLsCmd() *cobra.Command {
	var cf connFlags
	var output string
	ls := &cobra.Command{
		Use:   "ls [--output text|json]",
		Short: "List the plans with a stored spec: priority, quota, spec revision",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("listing specs", []auth.Role{auth.Admin, auth.Planner}, func(cmd *cobra.Command, _ []string) error {
			nc, js, err := cf.openPlan("default", output)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
			defer cancel()
			ss := store.NewSpecStore(js)
			ss.NoCreate = true
			specs, err := ss.List(ctx)
			if errors.Is(err, store.ErrNoSpecBucket) {
				return fmt.Errorf("no poolplanner state on this server: %w", err)
			}
			if err != nil {
				return busErr(err)
			}
			out := make([]specListing, len(specs))
			for i, s := range specs {
				out[i] = specListing{Plan: s.Plan, SpecRevision: s.Revision, Updated: s.Updated.UTC()}
				if spec, err := planner.ParseSpec(s.Spec); err != nil {
					out[i].Error = err.Error()
				} else {
					out[i].Priority, out[i].MaxGPUs = spec.Priority, spec.MaxGPUs
				}
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PLAN\tPRIORITY\tMAX GPUS\tSPEC REVISION\tUPDATED")
			var unparsed []specListing
			for _, l := range out {
				priority, quota := strconv.Itoa(l.Priority), "-"
				if l.MaxGPUs > 0 {
					quota = strconv.Itoa(l.MaxGPUs)
				}
				if l.Error != "" {
					// Neither is known: the columns say so, and the
					// error has a line of its own below.
					priority, quota = "?", "?"
					unparsed = append(unparsed, l)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", l.Plan, priority, quota, l.SpecRevision, l.Updated.Format(time.RFC3339))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, l := range unparsed {
				fmt.Fprintf(cmd.OutOrStdout(), "plan %s: its stored spec (spec revision %d) DOES NOT PARSE: %s (the planner plans on its last spec that does; planner spec get --plan %s prints it)\n",
					l.Plan, l.SpecRevision, l.Error, l.Plan)
			}
			return nil
		}),
	}
	cf.add(ls.Flags())
	ls.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return ls
}

// noState is a read-only command's error on a server without the
// poolplanner state it reads (err: its ErrNotFound): no planner ever ran
// there, or --server names another server.
func noState(err error) error {
	return fmt.Errorf("no poolplanner state on this server: %w; is --server the planner's server (or is planner serve running against it)?", err)
}

// specJSON converts a YAML or JSON spec to JSON for the wire.
func specJSON(data []byte) ([]byte, error) {
	v, err := planner.DecodeYAML(data)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
