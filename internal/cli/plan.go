package cli

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/wire"
)

// planFlags are the flags of planner plan.
type planFlags struct {
	inventory, spec, previous, output string
}

func newPlanCmd() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan --inventory FILE --spec FILE [--previous PLAN.json] [--output text|json|yaml]",
		Short: "Plan a job spec on an inventory file, offline",
		Long: `Plan a job spec on an inventory file, offline.

With --previous, plan incrementally from that plan document (the JSON of
planner plan --output json, or of the plan stream): every worker that can
stay keeps its place, the others are placed again, and the plan says what
moved and why: what the live service would do if the inventory became
this one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("previous") && f.previous == "" {
				return usagef("--previous: give the plan document's file")
			}
			return runPlan(cmd, f)
		},
	}
	cmd.Flags().StringVar(&f.inventory, "inventory", "", "inventory JSON: rlightning cluster info or a list of NodeInventory documents")
	cmd.Flags().StringVar(&f.spec, "spec", "", "job spec, YAML or JSON, or a rlightning job or cluster config (see planner spec convert)")
	cmd.Flags().StringVar(&f.previous, "previous", "", "plan document (JSON) to plan incrementally from: a dry run of a replan")
	cmd.Flags().StringVarP(&f.output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

func runPlan(cmd *cobra.Command, f planFlags) error {
	if !validOutput(f.output) {
		return usagef("--output: %q is not allowed; want text, json or yaml", f.output)
	}
	if f.inventory == "" || f.spec == "" {
		return usagef("plan needs --inventory FILE and --spec FILE")
	}
	nodes, err := loadNodes(f.inventory)
	if err != nil {
		return err
	}
	src, err := loadSpec(f.spec)
	if err != nil {
		return err
	}
	spec := src.Spec
	var doc *planner.Plan
	var planErr error
	if f.previous != "" {
		prev, err := loadPlan(f.previous)
		if err != nil {
			return err
		}
		var ch *planner.Change
		if planner.IsElastic(spec) {
			o := planner.PlanAlone(prev, spec, nodes)
			doc, ch, planErr = o.Plan, o.Change, o.Err
		} else {
			doc, ch, planErr = planner.Replan(prev, spec, nodes)
		}
		doc.Reason = dryRunReason(prev, doc, ch)
	} else if planner.IsElastic(spec) {
		// Elastic groups grow to their max within the inventory.
		o := planner.PlanAlone(nil, spec, nodes)
		doc, planErr = o.Plan, o.Err
	} else {
		doc, planErr = planner.ComputeWith(spec, nodes, planner.Options{PoolsOnly: f.output == "yaml"})
	}
	o := planner.WithinQuota(planner.Outcome{Plan: doc, Err: planErr}, spec)
	doc, planErr = o.Plan, o.Err
	doc.Priority = spec.Priority
	if planErr != nil && f.output == "yaml" {
		// No resource_pool to print: a partial one would read as a plan.
		fmt.Fprintln(cmd.ErrOrStderr(), "planner: no valid plan: "+planErr.Error())
		return exitError{ExitInvalid}
	}
	if f.output == "text" {
		writeSpecNotes(cmd.OutOrStdout(), f.spec, src)
	}
	if err := writePlan(cmd.OutOrStdout(), doc, f.output); err != nil {
		return fmt.Errorf("write plan: %w", err)
	}
	if planErr != nil {
		if f.output == "text" {
			fmt.Fprintln(cmd.ErrOrStderr(), "planner: no valid plan: "+planErr.Error())
		}
		return exitError{ExitInvalid}
	}
	return nil
}

// maxPlanFile bounds a --previous file, gzipped or not: a plan of 100,000
// nodes is about 400 MB of JSON.
const maxPlanFile = 1 << 30

// loadPlan reads a plan document: the JSON planner plan --output json
// writes, or a plan as the stream holds it (plain or gzip).
func loadPlan(path string) (*planner.Plan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("--previous: %v", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	zipped := false
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, usagef("--previous %s: gzip: %v", path, err)
		}
		// One gzip member: what follows it (the newline `nats req`
		// prints after a body) is not another.
		zr.Multistream(false)
		r, zipped = zr, true
	}
	data, err := io.ReadAll(io.LimitReader(r, maxPlanFile+1))
	if err != nil {
		return nil, usagef("--previous %s: %v", path, err)
	}
	if len(data) > maxPlanFile {
		return nil, usagef("--previous %s: over %d bytes; not a plan document", path, maxPlanFile)
	}
	if zipped {
		if rest, _ := io.ReadAll(io.LimitReader(br, 1<<10)); len(bytes.TrimSpace(rest)) > 0 {
			return nil, usagef("--previous %s: more after the gzipped document than white space", path)
		}
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, usagef("--previous %s: not a plan document (JSON object): %v", path, err)
	}
	if ref, ok := objectRef(keys); ok {
		return nil, usagef("--previous %s: a reference to object %s of bucket %s (a reply too large for one message), not the plan: fetch it with `nats object get %s %s` (gzipped JSON, which --previous reads)",
			path, ref.Object, ref.Bucket, ref.Bucket, ref.Object)
	}
	for _, k := range []string{"valid", "workers", "pools"} {
		if _, ok := keys[k]; !ok {
			return nil, usagef("--previous %s: not a plan document: no %q; give the JSON of planner plan --output json or of the plan stream", path, k)
		}
	}
	var p planner.Plan
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, usagef("--previous %s: %v", path, err)
	}
	return &p, nil
}

// objectRef reads keys as the reply that points at an object, if it is
// one: exactly bucket, object and size.
func objectRef(keys map[string]json.RawMessage) (wire.ObjectRef, bool) {
	var ref wire.ObjectRef
	if len(keys) != 3 || keys["bucket"] == nil || keys["object"] == nil || keys["size"] == nil {
		return ref, false
	}
	_ = json.Unmarshal(keys["bucket"], &ref.Bucket)
	_ = json.Unmarshal(keys["object"], &ref.Object)
	return ref, ref.Bucket != "" && ref.Object != ""
}

// dryRunReason says what a replan from prev did.
func dryRunReason(prev, next *planner.Plan, ch *planner.Change) string {
	from := "the previous plan"
	if prev.Revision > 0 {
		from = fmt.Sprintf("plan %s revision %d", prev.Name, prev.Revision)
	}
	what := ch.Summary()
	switch {
	case !next.Valid():
		what = "no valid plan"
	case what == "":
		what = "every worker keeps its place"
	}
	if r := next.Status.ResizeWords("(offline)"); r != "" {
		what = r + "; " + what
	}
	return "dry run from " + from + ": " + what
}

func validOutput(s string) bool { return s == "text" || s == "json" || s == "yaml" }

func loadNodes(path string) ([]planner.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--inventory: %v", err)
	}
	nodes, err := inventory.ParseNodes(data)
	if err != nil {
		return nil, usagef("--inventory %s: %v", path, err)
	}
	return nodes, nil
}

// loadSpec reads a spec file, a poolplanner spec or a rlightning job or
// cluster config: every command that takes a spec file reads it here, and
// stores or sends the poolplanner spec it stands for (src.Native).
func loadSpec(path string) (*planner.SpecSource, error) { return loadSpecAs("--spec", path) }

// loadSpecAs is loadSpec with errors under label.
func loadSpecAs(label, path string) (*planner.SpecSource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("%s: %v", label, err)
	}
	src, err := planner.ReadSpec(data)
	if err != nil {
		return nil, usagef("%s %s: %v", label, path, err)
	}
	return src, nil
}

func writePlan(w io.Writer, doc *planner.Plan, output string) error {
	switch output {
	case "json":
		// The plan's own encoder, one line, a megabyte at a time:
		// encoding/json would call it and then check and indent its
		// output again, 5 times the work at 20,000 nodes. Indented for a
		// person at a terminal only.
		if isTerminal(w) {
			var out bytes.Buffer
			if err := json.Indent(&out, doc.AppendJSON(nil), "", "  "); err != nil {
				return err
			}
			_, err := w.Write(append(out.Bytes(), '\n'))
			return err
		}
		bw := bufio.NewWriterSize(w, 1<<16)
		if err := doc.WriteJSON(bw); err != nil {
			return err
		}
		_ = bw.WriteByte('\n')
		return bw.Flush()
	case "yaml":
		b, err := doc.ResourcePoolYAML()
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return planner.WriteText(w, doc)
	}
}
