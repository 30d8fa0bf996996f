package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// statusReport is what planner status says: the plan's latest revision,
// which planner leads it, and where NATS keeps the state.
type statusReport struct {
	Plan     string `json:"plan"`
	Revision int    `json:"revision"`
	Valid    bool   `json:"valid"`
	// State is valid, degraded or invalid; Unplaced a degraded plan's
	// workers without a place; Pending why a stored spec is not in
	// force, if it is not.
	State    string          `json:"state,omitempty"`
	Status   *plan.Status    `json:"status,omitempty"`
	Unplaced []plan.Unplaced `json:"unplaced,omitempty"`
	Pending  string          `json:"pending_spec,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	Error    string          `json:"error,omitempty"`
	At       *time.Time      `json:"published_at,omitempty"`
	// Spec is the plan's stored spec: which (its revision in the spec
	// bucket) and since when; nil when it has none or it cannot be read.
	Spec    *specStatus    `json:"spec,omitempty"`
	Leader  *bus.Lease     `json:"leader"`
	Server  string         `json:"server"`
	Streams []streamStatus `json:"streams"`
	// Plans are every plan on the cluster (the one named too), by
	// priority; Nodes, per node, the GPUs each plan holds there.
	Plans []planStatus `json:"plans"`
	Nodes []nodeStatus `json:"nodes"`
	// Unavailable says what could not be read (a stream without a
	// quorum, say) and where the answer came from instead: status
	// answers in a few seconds from whatever is readable.
	Unavailable []string `json:"unavailable,omitempty"`
	// LeaderUnknown is set when the lease could not be read: Leader nil
	// then says nothing of whether a planner leads.
	LeaderUnknown bool `json:"leader_unknown,omitempty"`
	// Unplanned are the GPUs running processes though no worker of any
	// plan is placed on them.
	Unplanned []inventory.UnplannedGPU `json:"unplanned_use"`
	// Drained are the nodes and GPUs out of placement (planner drain,
	// and GPUs the planner holds out for flapping).
	Drained []drainListing `json:"drained"`
	// held are the GPUs the plans' latest revisions use, per node, read
	// for Unplanned.
	held map[string][]plan.Range
	// noSpec: the plan has no stored spec (read, not unavailable).
	noSpec bool
	// leaseRead is when the lease was read: its expiry is told as of
	// then, not as of the end of reads that may take seconds at scale
	// (which told a lease renewed meanwhile as expired).
	leaseRead time.Time
	// mu guards Unavailable while the reads run at once.
	mu sync.Mutex
}

// specStatus is which spec a plan's planner plans on: the stored one,
// from when, and whether the latest revision follows it (not while it
// is pending, the last spec's placement in force, nor before the
// plan's first revision).
type specStatus struct {
	Revision uint64    `json:"revision"`
	StoredAt time.Time `json:"stored_at"`
	InForce  bool      `json:"in_force"`
}

// statusPartTimeout bounds each read of status, all made at once: an
// unavailable stream costs this, not the whole request's time.
const statusPartTimeout = 2 * time.Second

// offlineAfter is how long a stream's leader may not have heard from a
// replica before status calls it offline: a few Raft heartbeats (one a
// second).
const offlineAfter = 5 * time.Second

// planStatus is one plan of those sharing the cluster.
type planStatus struct {
	Name        string   `json:"name"`
	Priority    int      `json:"priority"`
	Revision    int      `json:"revision"`
	Valid       bool     `json:"valid"`
	GPUsHeld    int      `json:"gpus_held"`
	Workers     int      `json:"workers"`
	Error       string   `json:"error,omitempty"`
	PreemptedBy []string `json:"preempted_by,omitempty"`
	// State is valid, degraded or invalid; Unplaced counts a degraded
	// plan's workers without a place.
	State    string       `json:"state"`
	Status   *plan.Status `json:"status,omitempty"`
	Unplaced int          `json:"unplaced,omitempty"`
	Pending  string       `json:"pending_spec,omitempty"`
	// Elastic are its elastic groups (worker_num {min, max}): how many
	// workers each holds now, of its range.
	Elastic []elasticGroup `json:"elastic,omitempty"`
}

// elasticGroup is one elastic group of a plan as status shows it.
type elasticGroup struct {
	Component string `json:"component"`
	Workers   int    `json:"workers"`
	Min       int    `json:"min"`
	Max       int    `json:"max"`
}

// elasticOf is d's elastic groups, named as a spec names them.
func elasticOf(d *plan.Header) []elasticGroup {
	var out []elasticGroup
	env := 0
	for _, dm := range d.Demands {
		if dm.Component == plan.Env {
			env++
		}
		if dm.Max > 0 {
			name := plan.Resize{Component: dm.Component, Group: max(env-1, 0)}.Name()
			out = append(out, elasticGroup{Component: name, Workers: dm.Workers, Min: dm.Min, Max: dm.Max})
		}
	}
	return out
}

// elasticText is a plan's elastic groups as "eval 12 (4..32)", or "-".
func elasticText(gs []elasticGroup) string {
	if len(gs) == 0 {
		return "-"
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%s %d (%d..%d)", g.Component, g.Workers, g.Min, g.Max)
	}
	return strings.Join(parts, ", ")
}

// nodeStatus is which plans hold a node's GPUs, and how many each.
type nodeStatus struct {
	NodeID string         `json:"node_id"`
	Plans  map[string]int `json:"plans"`
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
	// notFound: the stream does not exist (Error says so).
	notFound bool
}

type followerStatus struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	Lag     uint64 `json:"lag,omitempty"`
	// Seen is how long ago the stream's leader last heard from it.
	Seen time.Duration `json:"last_seen_ns"`
	// unheard: the stream has no leader, and this replica is not the
	// server that answered (followersOf).
	unheard bool
}

func newStatusCmd() *cobra.Command {
	var cf connFlags
	var plan, output string
	cmd := &cobra.Command{
		Use:   "status [--plan NAME] [--output text|json]",
		Short: "Show the plans on the cluster (priority, GPUs held, valid or why not), which plans hold each node's GPUs, the leading planner, and the replication of the state",
		Args:  cobra.NoArgs,
		RunE: cf.wrap("status", nil, func(cmd *cobra.Command, _ []string) error {
			nc, js, err := cf.openPlan(plan, output)
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
			r, err := readStatus(ctx, js, c, plan)
			if err != nil {
				return err
			}
			if err := r.missing(cmd.Flags().Changed("plan")); err != nil {
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

// readStatus reads the plan's latest revision, the lease, the streams
// and every plan at once, each within statusPartTimeout; what cannot be
// read is said in Unavailable, and the revision comes from the planner
// itself (request-reply, from its memory) when the stream cannot give
// it.
func readStatus(ctx context.Context, js jetstream.JetStream, c *client.Client, plan string) (*statusReport, error) {
	r := &statusReport{Plan: plan}
	ps := store.NewPlanStore(js)
	part := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, statusPartTimeout) }
	var wg sync.WaitGroup
	wg.Go(func() { r.readLatest(ctx, ps.Client(), c) })
	wg.Go(func() {
		pctx, cancel := part()
		defer cancel()
		r.readLeader(pctx, js, ps)
	})
	streams := bus.StateStreams()
	r.Streams = make([]streamStatus, len(streams))
	for i, name := range streams {
		wg.Go(func() {
			pctx, cancel := part()
			defer cancel()
			r.Streams[i] = streamOf(pctx, js, name, time.Now())
		})
	}
	plansRead := false
	wg.Go(func() {
		pctx, cancel := part()
		defer cancel()
		if err := r.readPlans(pctx, js, ps.Client()); err != nil {
			r.unavailable("the other plans: %v", err)
			return
		}
		plansRead = true
	})
	wg.Go(func() {
		pctx, cancel := part()
		defer cancel()
		r.readDrains(pctx, js)
	})
	var spec *store.StoredSpec
	noSpec := false
	wg.Go(func() {
		pctx, cancel := part()
		defer cancel()
		specs := store.NewSpecStore(js)
		specs.NoCreate = true
		e, err := specs.Entry(pctx, plan)
		switch {
		case err == nil:
			spec = &e
		case errors.Is(err, client.ErrNotFound) || errors.Is(err, store.ErrNoSpecBucket):
			noSpec = true
		default:
			r.unavailable("plan %s's stored spec: %v", plan, err)
		}
	})
	var nodes []inventory.NodeInventory
	wg.Go(func() {
		pctx, cancel := part()
		defer cancel()
		inv := store.NewInventoryStore(js)
		inv.NoCreate = true
		var err error
		if nodes, err = inv.List(pctx); err != nil && !errors.Is(err, store.ErrNoBucket) {
			r.unavailable("the inventory (for unplanned use): %v", err)
			nodes = nil
		}
	})
	wg.Wait()
	r.Unplanned = []inventory.UnplannedGPU{}
	if plansRead && nodes != nil {
		r.Unplanned = inventory.UnplannedUse(nodes, placedUUIDs(nodes, r.held))
	}
	r.noSpec = noSpec
	if spec != nil {
		r.Spec = &specStatus{Revision: spec.Revision, StoredAt: spec.Updated.UTC(), InForce: r.At != nil && r.Pending == ""}
	}
	judgeServers(r.Streams)
	r.judgeStreams()
	slices.Sort(r.Unavailable)
	return r, nil
}

// missing is status's refusal when there is nothing to report on: no
// poolplanner state on the server at all (none of its streams), or a
// plan named (named: --plan given) that has neither a revision nor a
// spec. A status of nothing would read as a healthy empty cluster.
func (r *statusReport) missing(named bool) error {
	none := len(r.Streams) > 0
	for _, s := range r.Streams {
		none = none && s.notFound
	}
	if none {
		return fmt.Errorf("no poolplanner state on this server: none of its streams (%s, ...) exists; is --server the planner's server (or is planner serve running against it)?", r.Streams[0].Name)
	}
	if named && r.At == nil && r.Error == "" && r.noSpec {
		return fmt.Errorf("plan %s: no such plan: it has no spec and no revision (planner spec ls lists the plans)", r.Plan)
	}
	return nil
}

// unavailable notes what could not be read; the reads call it at once.
func (r *statusReport) unavailable(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Unavailable = append(r.Unavailable, fmt.Sprintf(format, args...))
}

// readLatest reads the plan's latest revision from the stream, or from
// the planner when the stream cannot give it, each within
// statusPartTimeout.
func (r *statusReport) readLatest(ctx context.Context, stream, planner *client.Client) {
	pctx, cancel := context.WithTimeout(ctx, statusPartTimeout)
	defer cancel()
	// The header alone says all this prints: the summary, not the
	// whole revision (400,000 workers at 20,000 nodes).
	sum, err := stream.Summary(pctx, r.Plan)
	if err != nil && !errors.Is(err, client.ErrNotFound) {
		rctx, cancel := context.WithTimeout(ctx, statusPartTimeout)
		defer cancel()
		d, rerr := planner.RequestPlan(rctx, r.Plan, 0)
		if rerr != nil {
			r.Error = err.Error()
			r.unavailable("plan %s's latest revision: the stream: %v; the planner: %v", r.Plan, err, rerr)
			return
		}
		r.unavailable("the plan stream (%v): plan %s's latest revision came from the planner", err, r.Plan)
		sum, err = &client.Summarized{Header: d.Header}, nil
	}
	if err != nil {
		return
	}
	d := &sum.Header
	at := d.CreatedAt.UTC()
	r.Revision, r.Valid, r.Reason, r.Error, r.At = d.Revision, d.Valid(), d.Reason, d.Error, &at
	st := d.Status
	r.State, r.Status, r.Unplaced = string(st.State), &st, d.Unplaced
	if d.PendingSpec != nil {
		r.Pending = d.PendingSpec.Reason
	}
}

// readLeader reads the lease: none without a plan stream, unknown when
// it cannot be read.
func (r *statusReport) readLeader(ctx context.Context, js jetstream.JetStream, ps *store.PlanStore) {
	_, err := js.Stream(ctx, client.PlansStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	if err == nil {
		if r.Leader, err = ps.ReadLease(ctx, bus.LeaseName); err == nil {
			r.leaseRead = time.Now()
			return
		}
	}
	r.LeaderUnknown = true
	r.unavailable("the leader: the lease cannot be read: %v", err)
}

// placedUUIDs is the UUIDs, as nodes report them, of the GPUs held
// uses: a GPU is placed when a plan's worker uses its index on its node.
func placedUUIDs(nodes []inventory.NodeInventory, held map[string][]plan.Range) map[string]bool {
	out := map[string]bool{}
	for _, n := range nodes {
		rs := held[n.NodeID]
		for _, g := range n.GPUs {
			if slices.ContainsFunc(rs, func(r plan.Range) bool { return r.First <= g.Index && g.Index <= r.Last }) {
				out[g.UUID] = true
			}
		}
	}
	return out
}

// judgeServers marks a server offline on every stream once the streams
// together say so, quorum or not: a server is one process, whatever its
// streams, and each stream's own view lags or says nothing (a leader
// elected after the server died never heard from it; a stream without
// a leader knows nothing of its peers). Gone is offline on a stream
// with a leader (followersOf), or unheard on one without. Alive is
// heard from by a stream's leader within offlineAfter, a stream's
// leader itself, or the server that answered for a stream without a
// leader; alive wins, so a server that came back is not kept offline by
// a stream yet to hear from it.
func judgeServers(streams []streamStatus) {
	gone, alive := map[string]time.Duration{}, map[string]bool{}
	for _, s := range streams {
		if s.Leader != "" {
			alive[s.Leader] = true
		}
		for _, f := range s.Followers {
			switch {
			case f.Offline || f.unheard:
				gone[f.Name] = max(gone[f.Name], f.Seen)
			case s.Leader == "" && f.Current:
				alive[f.Name] = true
			case s.Leader != "" && f.Seen > 0 && f.Seen <= offlineAfter:
				alive[f.Name] = true
			}
		}
	}
	for i := range streams {
		for j := range streams[i].Followers {
			f := &streams[i].Followers[j]
			switch seen, ok := gone[f.Name]; {
			case ok && !alive[f.Name]:
				f.Offline, f.Seen = true, max(f.Seen, seen)
			case alive[f.Name] && f.unheard:
				f.unheard = false // another stream's leader heard it lately
			}
		}
	}
}

// judgeStreams notes the streams that could not be read or have no
// leader; without a leader for the plan stream no lease can be renewed,
// so a lease read from a replica says nothing of who leads.
func (r *statusReport) judgeStreams() {
	for _, s := range r.Streams {
		switch {
		case s.Error != "":
			r.unavailable("stream %s: %s", s.Name, s.Error)
		case s.Replicas > 1 && s.Leader == "":
			r.unavailable("stream %s: no leader (no quorum): nothing is written to it until servers return", s.Name)
			if s.Name == client.PlansStream {
				r.LeaderUnknown, r.Leader = true, nil
			}
		}
	}
}

// readPlans reads every plan's latest revision (but removed ones') and
// who holds each node's GPUs.
func (r *statusReport) readPlans(ctx context.Context, js jetstream.JetStream, c *client.Client) error {
	r.Plans, r.Nodes = []planStatus{}, []nodeStatus{}
	st, err := js.Stream(ctx, client.PlansStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the plans: %w", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(client.PlanSubjectPrefix+"*"))
	if err != nil {
		return fmt.Errorf("read the plans: %w", err)
	}
	held := map[string]map[string]int{}
	r.held = map[string][]plan.Range{}
	for subject := range info.State.Subjects {
		name := strings.TrimPrefix(subject, client.PlanSubjectPrefix)
		// Its summary, not its whole revision: status lists what the
		// header and the summary say.
		sum, err := c.Summary(ctx, name)
		if err != nil {
			r.Plans = append(r.Plans, planStatus{Name: name, Error: "unreadable: " + err.Error()})
			continue
		}
		d := &sum.Header
		if d.Removed() {
			continue
		}
		pending := ""
		if d.PendingSpec != nil {
			pending = d.PendingSpec.Reason
		}
		st := d.Status
		r.Plans = append(r.Plans, planStatus{State: string(st.State), Status: &st, Unplaced: len(d.Unplaced), Pending: pending, Name: name, Priority: d.Priority, Revision: d.Revision, Valid: d.Valid(),
			GPUsHeld: d.GPUsHeld, Workers: sum.Summary.Workers, Error: d.Error, PreemptedBy: d.PreemptedBy, Elastic: elasticOf(d)})
		// Client.Summary checked that it expands.
		_ = sum.Summary.Each(func(node string, _ int, gpus []plan.Range) bool {
			n := 0
			for _, g := range gpus {
				n += g.Len()
			}
			if n == 0 {
				return true // workers without GPUs hold none of the node's
			}
			if held[node] == nil {
				held[node] = map[string]int{}
			}
			held[node][name] += n
			r.held[node] = append(r.held[node], gpus...)
			return true
		})
	}
	slices.SortFunc(r.Plans, func(a, b planStatus) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), strings.Compare(a.Name, b.Name))
	})
	for node, plans := range held {
		r.Nodes = append(r.Nodes, nodeStatus{NodeID: node, Plans: plans})
	}
	slices.SortFunc(r.Nodes, func(a, b nodeStatus) int { return strings.Compare(a.NodeID, b.NodeID) })
	return nil
}

func streamOf(ctx context.Context, js jetstream.JetStream, name string, now time.Time) streamStatus {
	s := streamStatus{Name: name}
	st, err := js.Stream(ctx, name)
	if err != nil {
		s.Error, s.notFound = err.Error(), errors.Is(err, jetstream.ErrStreamNotFound)
		return s
	}
	info := st.CachedInfo()
	s.Replicas, s.Messages = info.Config.Replicas, info.State.Msgs
	if info.Cluster != nil {
		s.Leader = info.Cluster.Leader
		s.Followers = followersOf(info.Cluster, now)
	}
	return s
}

// followersOf is how a stream's replicas stand as its cluster info
// says, now. With a leader: a server killed without a word is not
// marked offline by the servers for a long while, so a replica the
// leader has not heard from for offlineAfter is offline, and so is one
// it never heard from (last heard 0) in the offlineAfter it has led (a
// leader elected after the server died). Without a leader the
// answering server knows only itself: it is the replica that is
// current, and every other is unheard, neither alive nor offline by
// this stream alone (its last-heard times are stale: judgeServers reads
// the streams together).
func followersOf(ci *jetstream.ClusterInfo, now time.Time) []followerStatus {
	var out []followerStatus
	for _, p := range ci.Replicas {
		f := followerStatus{Name: p.Name, Current: p.Current, Lag: p.Lag, Seen: p.Active}
		switch {
		case ci.Leader == "":
			f.unheard = !p.Current
			f.Seen = 0
		case p.Offline || p.Active > offlineAfter:
			f.Offline = true
		case p.Active == 0 && !p.Current && ci.LeaderSince != nil && now.Sub(*ci.LeaderSince) > offlineAfter:
			f.Offline, f.Seen = true, now.Sub(*ci.LeaderSince)
		}
		out = append(out, f)
	}
	return out
}

// stateText is a plan's state as status prints it, from its typed
// status (nil: a plan not read): valid, DEGRADED (N unplaced) or
// INVALID, with the error's words, or, where a document has none, its
// reason's.
func stateText(st *plan.Status, unplaced int, errText string) string {
	if st == nil {
		return "INVALID: " + errText
	}
	if errText == "" {
		errText = reasonText(st)
	}
	switch st.State {
	case plan.StateValid:
		return "valid"
	case plan.StateDegraded:
		return fmt.Sprintf("DEGRADED (%d unplaced): %s", unplaced, errText)
	}
	return "INVALID: " + errText
}

// reasonText words a status's reason.
func reasonText(st *plan.Status) string {
	by := "plan " + strings.Join(st.By, ", plan ")
	switch st.Reason {
	case plan.ReasonPreempted:
		return join("preempted by "+by, st.Cause)
	case plan.ReasonWaiting:
		return join("waits for room held by "+by, st.Cause)
	case plan.ReasonQuota:
		return join("over its max_gpus", st.Cause)
	case plan.ReasonRemoved:
		return "spec removed"
	case plan.ReasonDrained:
		return join("drained, no room elsewhere", st.Cause)
	}
	return st.Cause
}

// join is a and b, said one after the other.
func join(a, b string) string {
	if b == "" {
		return a
	}
	return a + ": " + b
}

func (r *statusReport) write(w io.Writer, now time.Time) error {
	switch {
	case r.At == nil && r.Error != "":
		fmt.Fprintf(w, "plan %s: unreadable: %s\n", r.Plan, r.Error)
	case r.At == nil:
		fmt.Fprintf(w, "plan %s: no revision yet\n", r.Plan)
	default:
		fmt.Fprintf(w, "plan %s: revision %d, %s, published %s (%s ago)\n  reason: %s\n",
			r.Plan, r.Revision, stateText(r.Status, len(r.Unplaced), r.Error), r.At.Format(time.RFC3339), now.Sub(*r.At).Round(time.Second), r.Reason)
		for _, u := range r.Unplaced {
			where := ""
			if u.NodeID != "" {
				where = fmt.Sprintf(" (ran on %s GPUs %v)", u.NodeID, u.GPUs)
			}
			fmt.Fprintf(w, "  unplaced: %s %d: %s%s\n", u.Component, u.Index, u.Reason, where)
		}
		if r.Pending != "" {
			fmt.Fprintf(w, "  pending spec: %s (the last placement stays in force)\n", r.Pending)
		}
	}
	if s := r.Spec; s != nil {
		state := "in force"
		switch {
		case r.At == nil:
			state = "no revision planned on it yet"
		case !s.InForce:
			state = "pending: the placement follows the spec before it"
		}
		fmt.Fprintf(w, "  spec: spec revision %d, stored %s (%s ago), %s\n", s.Revision, s.StoredAt.Format(time.RFC3339), now.Sub(s.StoredAt).Round(time.Second), state)
	}
	if r.LeaderUnknown {
		fmt.Fprintln(w, "leader: UNKNOWN: the plan stream is unavailable, so no lease can be read or renewed")
	} else if l := r.Leader; l != nil {
		at := now
		if !r.leaseRead.IsZero() {
			at = r.leaseRead
		}
		fmt.Fprintf(w, "leader: planner %s on %s (pid %d), leading since %s, lease expires in %s unless renewed\n",
			l.Holder, l.Host, l.PID, l.Since.UTC().Format(time.RFC3339), l.Expires().Sub(at).Round(100*time.Millisecond))
		for _, p := range l.Problems {
			fmt.Fprintf(w, "  PROBLEM: %s\n", p)
		}
	} else {
		fmt.Fprintln(w, "leader: none: no planner holds the lease (none runs, or a standby takes it within a second)")
	}
	fmt.Fprintf(w, "connected to %s\n", r.Server)
	for _, u := range r.Unavailable {
		fmt.Fprintf(w, "unavailable: %s\n", u)
	}
	r.writePlans(w)
	r.writeUnplanned(w)
	r.writeDrained(w)
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
			case !f.Current && s.Leader == "":
				// Only a leader knows how far behind a replica is.
				state = "not known: no leader to ask"
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

// writePlans prints the plans sharing the cluster and, per node, which
// of them hold its GPUs.
// writeUnplanned lists the GPUs in unplanned use, if any.
func (r *statusReport) writeUnplanned(w io.Writer) {
	if len(r.Unplanned) == 0 {
		return
	}
	fmt.Fprintf(w, "UNPLANNED USE: %d GPUs run processes no worker is placed on\n", len(r.Unplanned))
	// A hostile document may list many processes on every GPU: the
	// text shows the first GPUs (each with its first processes, see
	// ProcessList), --output json all.
	const listed = 32
	for _, u := range r.Unplanned[:min(len(r.Unplanned), listed)] {
		fmt.Fprintf(w, "  %s GPU %d (%s): %s\n", u.NodeID, u.Index, u.UUID, inventory.ProcessList(u.Processes))
	}
	if more := len(r.Unplanned) - listed; more > 0 {
		fmt.Fprintf(w, "  and %d more GPUs (--output json lists them all)\n", more)
	}
}

func (r *statusReport) writePlans(w io.Writer) {
	if len(r.Plans) == 0 {
		return
	}
	// The ELASTIC column only where some plan has elastic groups: the
	// table reads as before for fixed plans.
	elastic := slices.ContainsFunc(r.Plans, func(p planStatus) bool { return len(p.Elastic) > 0 })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if elastic {
		fmt.Fprintln(tw, "PLAN\tPRIORITY\tREVISION\tGPUS\tWORKERS\tELASTIC\tSTATE")
	} else {
		fmt.Fprintln(tw, "PLAN\tPRIORITY\tREVISION\tGPUS\tWORKERS\tSTATE")
	}
	for _, p := range r.Plans {
		if elastic {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.Priority, p.Revision, p.GPUsHeld, p.Workers, elasticText(p.Elastic), stateText(p.Status, p.Unplaced, p.Error))
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", p.Name, p.Priority, p.Revision, p.GPUsHeld, p.Workers, stateText(p.Status, p.Unplaced, p.Error))
	}
	_ = tw.Flush()
	if len(r.Nodes) == 0 {
		return
	}
	// Runs of nodes held alike fold into one line, as in the text map:
	// in the ids' natural order, only ids that follow one another, so
	// that "a .. b (n nodes)" names exactly the n nodes from a to b.
	nodes := slices.Clone(r.Nodes)
	slices.SortStableFunc(nodes, func(a, b nodeStatus) int { return plan.CompareNodeIDs(a.NodeID, b.NodeID) })
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODES\tGPUS HELD BY")
	for i := 0; i < len(nodes); {
		line := heldLine(nodes[i].Plans)
		j := i + 1
		for j < len(nodes) && plan.Follows(nodes[j-1].NodeID, nodes[j].NodeID) && heldLine(nodes[j].Plans) == line {
			j++
		}
		run := nodes[i].NodeID
		if j-i > 1 {
			run = fmt.Sprintf("%s .. %s (%d nodes)", run, nodes[j-1].NodeID, j-i)
		}
		fmt.Fprintf(tw, "%s\t%s\n", run, line)
		i = j
	}
	_ = tw.Flush()
}

// heldLine says which plans hold how many of a node's GPUs.
func heldLine(plans map[string]int) string {
	names := slices.Sorted(maps.Keys(plans))
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s %d", name, plans[name])
	}
	return strings.Join(parts, ", ")
}
