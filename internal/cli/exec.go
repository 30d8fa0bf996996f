package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// execFunc replaces this process with argv0 (a path) run with argv and
// env: syscall.Exec, so that signals and the exit code are the
// command's own. Tests replace it.
type execFunc func(argv0 string, argv, env []string) error

func newExecCmd(run execFunc) *cobra.Command {
	var cf connFlags
	var plan, nodeID string
	var waitFree time.Duration
	cmd := &cobra.Command{
		Use:   "exec COMPONENT INDEX [--node-id ID] [--wait-free DURATION] -- CMD [ARGS...]",
		Short: "Run CMD as a worker of the live plan: CUDA_VISIBLE_DEVICES and POOLPLANNER_* set, on the worker's node only",
		Long: `exec looks the worker up in the live plan and runs CMD in its place (the
process is replaced: signals and the exit code are CMD's), with
CUDA_VISIBLE_DEVICES set to the worker's GPU UUIDs and POOLPLANNER_PLAN,
POOLPLANNER_REVISION, POOLPLANNER_COMPONENT, POOLPLANNER_INDEX,
POOLPLANNER_NODE_ID and POOLPLANNER_GPU_SHARE. It refuses when this host is
not the worker's node: the node id is the hostname, as the reporter's,
unless --node-id says otherwise.

Before it runs CMD it waits, up to --wait-free, until the worker's GPUs run
no other process (as the node's reporter reports them): a GPU a revision
moved from another worker may still run it. It says once what it waits
for: each GPU's processes and which worker held the GPU in the revision
before. --wait-free 0 starts at once.`,
		Args: cobra.MinimumNArgs(3),
		RunE: cf.wrap("exec", nil, func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 2 || len(args) < 3 {
				return usagef("exec needs COMPONENT INDEX -- CMD [ARGS...]")
			}
			index, err := strconv.Atoi(args[1])
			if err != nil || index < 0 {
				return usagef("INDEX %q: want a whole number >= 0", args[1])
			}
			if nodeID == "" {
				facts, err := inventory.LocalFacts(inventory.FactsOptions{})
				if facts.NodeID == "" {
					return fmt.Errorf("this host's node id: %w; pass --node-id", err)
				}
				nodeID = facts.NodeID
			}
			path, err := exec.LookPath(args[2])
			if err != nil {
				return usagef("CMD %q: %v", args[2], err)
			}
			w, err := lookupWorker(cmd.Context(), &cf, plan, args[0], index)
			if err != nil {
				return err
			}
			if w.NodeID != nodeID {
				return fmt.Errorf("%s %d of plan %s (revision %d) runs on node %s, not on this one (%s); run it there, or pass --node-id if this host reports under another id",
					args[0], index, w.Plan, w.Revision, w.NodeID, nodeID)
			}
			if waitFree < 0 {
				return usagef("--wait-free %s: must be >= 0", waitFree)
			}
			if waitFree > 0 && len(w.GPUUUIDs) > 0 {
				if err := waitGPUsFree(cmd.Context(), &cf, *w, waitFree, cmd.ErrOrStderr()); err != nil {
					return err
				}
			}
			return run(path, args[2:], workerEnv(os.Environ(), *w))
		}),
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&plan, "plan", "default", "plan name")
	cmd.Flags().StringVar(&nodeID, "node-id", "", "this host's node id, as its reporter reports it (default: the hostname)")
	durationVar(cmd.Flags(), &waitFree, "wait-free", DefaultWaitFree, "wait up to this long for the worker's GPUs to run no other process (0: do not wait)")
	return cmd
}

// DefaultWaitFree is how long exec waits for a worker's GPUs to be
// free: long enough for a trainer to save and exit.
const DefaultWaitFree = 5 * time.Minute

// freePoll is how often exec looks at the node's inventory while it
// waits (the reporter reports a process ending within its poll).
const freePoll = 500 * time.Millisecond

// waitGPUsFree waits until none of w's GPUs runs a process but this
// one, as the node's inventory says, for at most within; it says once
// on stderr what it waits for.
func waitGPUsFree(ctx context.Context, cf *connFlags, w client.PlacedWorker, within time.Duration, stderr io.Writer) error {
	nc, js, err := cf.dialPlan(w.Plan)
	if err != nil {
		return err
	}
	defer nc.Close()
	invs := store.NewInventoryStore(js)
	invs.NoCreate = true
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	shared, err := sharedGPUs(ctx, nc, w)
	if err != nil {
		return err
	}
	said := false
	for {
		busy, err := busyGPUs(ctx, invs, w, shared)
		switch {
		case err == nil && len(busy) == 0:
			return nil
		case err == nil && !said:
			said = true
			fmt.Fprintf(stderr, "planner exec: %s %d of plan %s (revision %d) waits up to %s for its GPUs to be free:\n%s",
				w.Component, w.Index, w.Plan, w.Revision, within, describeBusy(ctx, nc, w, busy))
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("%d of its GPUs still run other processes", len(busy))
			}
			return fmt.Errorf("%s %d: GPUs not free after --wait-free %s: %w; stop what runs there, or pass --wait-free 0 to start anyway", w.Component, w.Index, within, err)
		case <-time.After(freePoll):
		}
	}
}

// busyGPU is one of a worker's GPUs that runs other processes.
type busyGPU struct {
	gpu       inventory.GPU
	processes []inventory.Process
}

// sharedGPUs is the UUIDs of w's GPUs that other workers of w's
// revision use too (fractional env workers, colocated components):
// their processes are those workers', not a previous holder's, so exec
// does not wait on them.
func sharedGPUs(ctx context.Context, nc *nats.Conn, w client.PlacedWorker) (map[string]bool, error) {
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := c.RequestPlan(rctx, w.Plan, w.Revision)
	if err != nil {
		return nil, fmt.Errorf("read plan %s revision %d: %w", w.Plan, w.Revision, err)
	}
	mine := map[string]bool{}
	for _, u := range w.GPUUUIDs {
		mine[u] = true
	}
	shared := map[string]bool{}
	for _, o := range d.Workers.All() {
		if o.Component == w.Component && o.Index == w.Index {
			continue
		}
		for _, u := range o.GPUUUIDs {
			if mine[u] {
				shared[u] = true
			}
		}
	}
	return shared, nil
}

// busyGPUs reads w's node's inventory: its GPUs (but those it shares
// with other workers of its revision) that run a process other than
// this one.
func busyGPUs(ctx context.Context, store *store.InventoryStore, w client.PlacedWorker, shared map[string]bool) ([]busyGPU, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	inv, _, err := store.Get(rctx, w.NodeID)
	if err != nil {
		return nil, fmt.Errorf("read node %s's inventory: %w", w.NodeID, err)
	}
	mine := map[string]bool{}
	for _, u := range w.GPUUUIDs {
		mine[u] = true
	}
	self := uint32(os.Getpid())
	var out []busyGPU
	for _, g := range inv.GPUs {
		if !mine[g.UUID] || shared[g.UUID] {
			continue
		}
		var others []inventory.Process
		for _, p := range g.Processes {
			if p.PID != self {
				others = append(others, p)
			}
		}
		if len(others) > 0 {
			out = append(out, busyGPU{g, others})
		}
	}
	return out, nil
}

// describeBusy says, a line per GPU, what runs on it and which worker
// held it in the plan's revision before w's.
func describeBusy(ctx context.Context, nc *nats.Conn, w client.PlacedWorker, busy []busyGPU) string {
	held := map[string]string{}
	if w.Revision > 1 {
		if c, err := client.New(nc); err == nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if prev, err := c.RequestPlan(rctx, w.Plan, w.Revision-1); err == nil {
				for _, pw := range prev.Workers.All() {
					for _, u := range pw.GPUUUIDs {
						held[u] = fmt.Sprintf("%s %d of plan %s in revision %d", pw.Component, pw.Index, w.Plan, w.Revision-1)
					}
				}
			}
		}
	}
	var b strings.Builder
	for _, bg := range busy {
		who := held[bg.gpu.UUID]
		if who == "" {
			who = fmt.Sprintf("no worker of plan %s held it in the revision before", w.Plan)
		}
		fmt.Fprintf(&b, "  GPU %d (%s) runs %s; %s\n", bg.gpu.Index, bg.gpu.UUID, inventory.ProcessList(bg.processes), who)
	}
	return b.String()
}

// lookupWorker asks the live plan where worker index of component runs.
func lookupWorker(ctx context.Context, cf *connFlags, plan, component string, index int) (*client.PlacedWorker, error) {
	nc, _, err := cf.dialPlan(plan)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var w client.PlacedWorker
	if err := bus.Request(ctx, nc, client.LookupSubject, wire.LookupRequest{Plan: plan, Component: component, Index: &index}, &w); err != nil {
		return nil, busErr(err)
	}
	return &w, nil
}

// workerEnv is env with the worker's variables set, replacing any of
// the same names.
func workerEnv(env []string, w client.PlacedWorker) []string {
	set := map[string]string{
		"CUDA_VISIBLE_DEVICES":  w.CUDAVisibleDevices,
		"POOLPLANNER_PLAN":      w.Plan,
		"POOLPLANNER_REVISION":  strconv.Itoa(w.Revision),
		"POOLPLANNER_COMPONENT": string(w.Component),
		"POOLPLANNER_INDEX":     strconv.Itoa(w.Index),
		"POOLPLANNER_NODE_ID":   w.NodeID,
		"POOLPLANNER_GPU_SHARE": strconv.FormatFloat(w.GPUShare, 'g', -1, 64),
	}
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); !hasKey(set, name) {
			out = append(out, kv)
		}
	}
	for _, name := range []string{"CUDA_VISIBLE_DEVICES", "POOLPLANNER_PLAN", "POOLPLANNER_REVISION", "POOLPLANNER_COMPONENT",
		"POOLPLANNER_INDEX", "POOLPLANNER_NODE_ID", "POOLPLANNER_GPU_SHARE"} {
		out = append(out, name+"="+set[name])
	}
	return out
}

// systemExec is execFunc for real.
func systemExec(argv0 string, argv, env []string) error {
	if err := syscall.Exec(argv0, argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", argv0, err)
	}
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}
