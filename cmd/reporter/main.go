// Command reporter keeps this node's inventory (GPUs from NVML, or
// simulated) in the poolplanner inventory bucket. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/poolplanner/poolplanner/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := cli.ReporterMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
