package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/planner"
)

func newSpecConvertCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "convert FILE",
		Short: "Print the poolplanner spec a rlightning job or cluster config stands for",
		Long: `spec convert prints, as YAML, the poolplanner spec that FILE stands for:
for a composed rlightning job config (python train.py ... --cfg job
--resolve) or a single cluster group file, the scheduling rlightning's
setup_component_scheduling builds from it, with cluster.placement and
cluster.resource_pool. Comments above it list the defaults it assumed and
the rlightning fields it ignored. A poolplanner spec is printed as it is.
plan, validate, spec set and serve --spec read such configs the same
way; the spec stored and planned is this one. Offline: no NATS.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := loadSpecAs("convert", args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if src.Format != planner.FormatNative {
				writeConvertHeader(w, args[0], src)
			}
			_, err = w.Write(src.Native)
			return err
		},
	}
}

// writeConvertHeader writes what a translation assumed and ignored as
// YAML comments, so that the spec printed below them can be kept as it is.
func writeConvertHeader(w io.Writer, path string, src *planner.SpecSource) {
	fmt.Fprintf(w, "# poolplanner spec of %s %s: the scheduling setup_component_scheduling builds\n", src.Format, path)
	if len(src.Assumed) > 0 {
		fmt.Fprintln(w, "# assumed rlightning's defaults (the config does not give them):")
		for _, d := range src.Assumed {
			fmt.Fprintf(w, "#   %s: %s\n", d.Field, assumedValue(d))
		}
	}
	if len(src.Ignored) > 0 {
		fmt.Fprintf(w, "# ignored %d rlightning %s, which the scheduling does not read:\n", len(src.Ignored), plural(len(src.Ignored), "field", "fields"))
		for _, line := range ignoredLines(src.Ignored) {
			fmt.Fprintf(w, "#   %s\n", line)
		}
	}
}

// ignoredLines groups ignored fields by the mapping they are in: one
// line of the top-level names, then one per mapping ("env[0]: backend,
// name, ...").
func ignoredLines(fields []string) []string {
	var order []string
	by := map[string][]string{}
	for _, f := range fields {
		parent, name := "", f
		if i := strings.LastIndexByte(f, '.'); i >= 0 {
			parent, name = f[:i], f[i+1:]
		}
		if _, ok := by[parent]; !ok {
			order = append(order, parent)
		}
		by[parent] = append(by[parent], name)
	}
	lines := make([]string, 0, len(order))
	for _, p := range order {
		names := strings.Join(by[p], ", ")
		if p != "" {
			names = p + ": " + names
		}
		lines = append(lines, names)
	}
	return lines
}

// writeSpecNotes tells a person that a spec file was a rlightning
// config, what it assumed, and how many fields it ignored. Nothing for a
// poolplanner spec.
func writeSpecNotes(w io.Writer, path string, src *planner.SpecSource) {
	if src == nil || src.Format == planner.FormatNative {
		return
	}
	fmt.Fprintf(w, "spec: %s %s, read as the scheduling rlightning builds from it (planner spec convert prints the spec)\n", src.Format, path)
	if len(src.Assumed) > 0 {
		fmt.Fprintf(w, "  assumed rlightning's defaults: %s\n", strings.Join(assumedFields(src), "; "))
	}
	if n := len(src.Ignored); n > 0 {
		fmt.Fprintf(w, "  ignored %d rlightning %s, which the scheduling does not read\n", n, plural(n, "field", "fields"))
	}
	fmt.Fprintln(w)
}

func assumedValue(d planner.Default) string {
	if d.Why == "" {
		return d.Value
	}
	return d.Value + " (" + d.Why + ")"
}

// assumedFields are the rlightning defaults src assumed, each its field
// and value.
func assumedFields(src *planner.SpecSource) []string {
	out := make([]string, len(src.Assumed))
	for i, d := range src.Assumed {
		out[i] = d.Field + " " + assumedValue(d)
	}
	return out
}
