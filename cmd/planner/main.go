// Command planner plans GPU placements for RL jobs, offline or as a NATS
// service. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/poolplanner/poolplanner/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
