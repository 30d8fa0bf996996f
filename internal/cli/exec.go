package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
)

// execFunc replaces this process with argv0 (a path) run with argv and
// env: syscall.Exec, so that signals and the exit code are the
// command's own. Tests replace it.
type execFunc func(argv0 string, argv, env []string) error

func newExecCmd(run execFunc) *cobra.Command {
	var cf connFlags
	var plan, nodeID string
	cmd := &cobra.Command{
		Use:   "exec COMPONENT INDEX [--node-id ID] -- CMD [ARGS...]",
		Short: "Run CMD as a worker of the live plan: CUDA_VISIBLE_DEVICES and POOLPLANNER_* set, on the worker's node only",
		Long: `exec looks the worker up in the live plan and runs CMD in its place (the
process is replaced: signals and the exit code are CMD's), with
CUDA_VISIBLE_DEVICES set to the worker's GPU UUIDs and POOLPLANNER_PLAN,
POOLPLANNER_REVISION, POOLPLANNER_COMPONENT, POOLPLANNER_INDEX,
POOLPLANNER_NODE_ID and POOLPLANNER_GPU_SHARE. It refuses when this host is
not the worker's node: the node id is the hostname, as the reporter's,
unless --node-id says otherwise.`,
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
			return run(path, args[2:], workerEnv(os.Environ(), *w))
		}),
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVar(&plan, "plan", "default", "plan name")
	cmd.Flags().StringVar(&nodeID, "node-id", "", "this host's node id, as its reporter reports it (default: the hostname)")
	return cmd
}

// lookupWorker asks the live plan where worker index of component runs.
func lookupWorker(ctx context.Context, cf *connFlags, plan, component string, index int) (*bus.PlacedWorker, error) {
	nc, _, err := cf.dialPlan(plan)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var w bus.PlacedWorker
	if err := bus.Request(ctx, nc, bus.LookupSubject, bus.LookupRequest{Plan: plan, Component: component, Index: &index}, &w); err != nil {
		return nil, busErr(err)
	}
	return &w, nil
}

// workerEnv is env with the worker's variables set, replacing any of
// the same names.
func workerEnv(env []string, w bus.PlacedWorker) []string {
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
