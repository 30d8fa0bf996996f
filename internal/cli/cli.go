// Package cli holds the planner command's subcommands, so that main stays
// one line and every command can be run, and tested, in-process.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes of the contract.
const (
	ExitOK      = 0
	ExitInvalid = 1 // no valid plan; the document still went to stdout
	ExitUsage   = 2 // bad input or usage; one line on stderr
)

// usageError marks errors that are the caller's input, not a failed plan.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitError carries an exit code without a message: the command already
// wrote what it had to say.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// Main runs the planner command line and returns the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(stderr, "planner: "+strings.Join(strings.Fields(err.Error()), " "))
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		return ExitUsage
	}
	return ExitInvalid
}

// isCobraUsage tells cobra's own flag and argument errors, which it
// returns as plain errors, from failures of the work itself.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown flag", "unknown shorthand", "unknown command", "flag needs an argument", "invalid argument", "accepts ", "requires at least", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	return newRootWith(stdin, stdout, stderr, systemExec)
}

// newRootWith is the command tree, planner exec running commands with
// run.
func newRootWith(stdin io.Reader, stdout, stderr io.Writer, run execFunc) *cobra.Command {
	root := &cobra.Command{
		Use:           "planner",
		Short:         "Plan GPU placement for RL jobs (train, eval, env, buffer workers)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newPlanCmd())
	root.AddCommand(append(clientCommands(), newServeCmd(), newCredsCmd(), newAuthCmd(), newExecCmd(run))...)
	return root
}
