package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
)

func newPlanCmd() *cobra.Command {
	var invPath, specPath, output string
	cmd := &cobra.Command{
		Use:   "plan --inventory FILE --spec FILE [--output text|json|yaml]",
		Short: "Plan a job spec on an inventory file, offline",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !validOutput(output) {
				return usagef("--output: %q is not allowed; want text, json or yaml", output)
			}
			if invPath == "" || specPath == "" {
				return usagef("plan needs --inventory FILE and --spec FILE")
			}
			nodes, err := loadNodes(invPath)
			if err != nil {
				return err
			}
			spec, err := loadSpec(specPath)
			if err != nil {
				return err
			}
			doc, planErr := planner.ComputeWith(spec, nodes, planner.Options{PoolsOnly: output == "yaml"})
			if err := writePlan(cmd.OutOrStdout(), doc, output); err != nil {
				return fmt.Errorf("write plan: %w", err)
			}
			if planErr != nil {
				if output == "text" {
					fmt.Fprintln(cmd.ErrOrStderr(), "planner: no valid plan: "+planErr.Error())
				}
				return exitError{ExitInvalid}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&invPath, "inventory", "", "inventory JSON: rlightning cluster info or a list of NodeInventory documents")
	cmd.Flags().StringVar(&specPath, "spec", "", "job spec, YAML or JSON")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
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

func loadSpec(path string) (*planner.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--spec: %v", err)
	}
	spec, err := planner.ParseSpec(data)
	if err != nil {
		return nil, usagef("--spec %s: %v", path, err)
	}
	return spec, nil
}

func writePlan(w io.Writer, doc *planner.Plan, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
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
