package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/store"
)

// connFlags are a client command's connection: --server, --creds and
// --tls-ca. The command's errors are reworded by bus.Explain, since NATS
// reports a refused subject apart from the request that used it.
type connFlags struct {
	server string
	sec    bus.Security
	nc     *nats.Conn
}

// add declares the flags on f.
func (c *connFlags) add(f *pflag.FlagSet) {
	f.StringVar(&c.server, "server", defaultServer(), "NATS URL of the planner service")
	addSecurity(f, &c.sec)
}

// addSecurity declares --creds and --tls-ca.
func addSecurity(f *pflag.FlagSet, sec *bus.Security) {
	f.StringVar(&sec.Creds, "creds", "", "NATS credentials `FILE` (planner creds ROLE makes one)")
	f.StringVar(&sec.TLSCA, "tls-ca", "", "CA certificate (PEM) that signed the server's TLS certificate")
}

// dial connects for one command.
func (c *connFlags) dial() (*nats.Conn, jetstream.JetStream, error) {
	opts, err := c.sec.Options()
	if err != nil {
		return nil, nil, usageError{err}
	}
	if err := c.sec.Expired(time.Now()); err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", c.server, err)
	}
	// Refusals come back through Explain, from the connection's last
	// error; nats.go would print them on stderr besides.
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	opts = append([]nats.Option{nats.Name("poolplanner-client"), nats.Timeout(5 * time.Second), quiet}, opts...)
	nc, err := nats.Connect(c.server, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrNoServers) {
			return nil, nil, fmt.Errorf("connect %s: %w (is `planner serve` running?)", c.server, err)
		}
		return nil, nil, fmt.Errorf("connect %s: %w", c.server, err)
	}
	c.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// dialPlan checks --plan, then dials: the commands that read or write
// one plan's stream or spec refuse a bad name before touching NATS.
func (c *connFlags) dialPlan(plan string) (*nats.Conn, jetstream.JetStream, error) {
	if err := store.ValidatePlanName(plan); err != nil {
		return nil, nil, usagef("--plan: %v", err)
	}
	return c.dial()
}

// openPlan checks --output (text or json), then dials for plan.
func (c *connFlags) openPlan(plan, output string) (*nats.Conn, jetstream.JetStream, error) {
	if output != "text" && output != "json" {
		return nil, nil, usagef("--output: %q is not allowed; want text or json", output)
	}
	return c.dialPlan(plan)
}

// addPlanOutput declares the connection flags, --plan and --output
// text|json.
func (c *connFlags) addPlanOutput(cmd *cobra.Command, plan, output *string) {
	c.add(cmd.Flags())
	cmd.Flags().StringVar(plan, "plan", "default", "plan name")
	cmd.Flags().StringVarP(output, "output", "o", "text", "output format: text or json")
}

// wrap rewords run's errors for a person (bus.Explain), and refuses at
// once what the credentials' role may not do (need: the roles allowed;
// none: any).
func (c *connFlags) wrap(what string, need []auth.Role, run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if len(need) > 0 {
			id, err := c.sec.Identity()
			if err != nil {
				return usageError{err}
			}
			if id.Role != "" && !roleIn(id.Role, need) {
				return fmt.Errorf("permissions: %s needs %s credentials; --creds %s is a %s's (`planner creds %s` makes one)",
					what, need[0], c.sec.Creds, id.Role, need[0])
			}
		}
		err := run(cmd, args)
		var ue usageError
		var ee exitError
		if err == nil || errors.As(err, &ue) || errors.As(err, &ee) {
			return err
		}
		return bus.Explain(err, c.nc, c.sec)
	}
}

func roleIn(r auth.Role, rs []auth.Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}
