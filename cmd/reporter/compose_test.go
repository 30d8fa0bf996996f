package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/poolplanner/poolplanner/internal/cli"
	"slices"
	"strings"
	"testing"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/poolplanner/poolplanner/internal/inventory"
)

// composeFile is the repository's docker-compose.yaml.
const composeFile = "../../docker-compose.yaml"

// loadCompose loads composeFile the way `docker compose` does, offline and
// without a docker engine; the environment is empty, so ${VAR:-default}
// takes its default.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := composecli.NewProjectOptions([]string{composeFile},
		composecli.WithName("poolplanner-test"),
		composecli.WithEnv(nil),
		composecli.WithInterpolation(true),
		composecli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load %s: %v", composeFile, err)
	}
	return p
}

// reporterServices are the services whose command runs the reporter.
func reporterServices(t *testing.T, p *types.Project) []string {
	t.Helper()
	var out []string
	for _, name := range p.ServiceNames() {
		if cmd := p.Services[name].Command; len(cmd) > 0 && cmd[0] == "reporter" {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no service runs reporter", composeFile)
	}
	return out
}

// TestComposeReporterFlags runs each compose reporter command through the
// real command: every flag must be known (checked with --help, which
// parses the flags and stops), and the values must pass the reporter's
// own checks (checked with --once --simulate, which validates everything
// and prints the inventory without NATS).
func TestComposeReporterFlags(t *testing.T) {
	p := loadCompose(t)
	for _, name := range reporterServices(t, p) {
		args := []string(p.Services[name].Command[1:])
		t.Run(name, func(t *testing.T) {
			line := "reporter " + strings.Join(args, " ")
			code, _, stderr := runMain(t, append(slices.Clone(args), "--help")...)
			if code != cli.ExitOK {
				t.Fatalf("%s: exit %d: %s", line, code, stderr)
			}
			if slices.Contains(args, "--once") {
				t.Fatalf("%s: --once exits at once; a compose reporter must keep running", line)
			}
			once := append(slices.Clone(args), "--once")
			if !slices.ContainsFunc(args, func(a string) bool { return a == "--simulate" || strings.HasPrefix(a, "--simulate=") }) {
				// Validate the values without depending on this machine's GPUs.
				once = append(once, "--simulate", "1xH100")
			}
			code, stdout, stderr := runMain(t, once...)
			if code != cli.ExitOK {
				t.Fatalf("%s: exit %d: %s", strings.Join(once, " "), code, stderr)
			}
			var inv inventory.NodeInventory
			if err := json.NewDecoder(bytes.NewReader([]byte(stdout))).Decode(&inv); err != nil {
				t.Fatalf("%s: stdout is not a NodeInventory: %v", line, err)
			}
		})
	}
}

// TestComposeReporterGPUs checks that each reporter service that reads
// NVML (no --simulate) reserves every NVIDIA GPU of its host.
func TestComposeReporterGPUs(t *testing.T) {
	p := loadCompose(t)
	for _, name := range reporterServices(t, p) {
		svc := p.Services[name]
		if slices.ContainsFunc(svc.Command, func(a string) bool { return a == "--simulate" || strings.HasPrefix(a, "--simulate=") }) {
			continue
		}
		if !hasNvidiaReservation(svc) {
			t.Errorf("service %s reads NVML but does not reserve GPUs; want deploy.resources.reservations.devices: [{driver: nvidia, count: all, capabilities: [gpu]}]", name)
		}
	}
}

func hasNvidiaReservation(svc types.ServiceConfig) bool {
	if svc.Deploy == nil || svc.Deploy.Resources.Reservations == nil {
		return false
	}
	for _, d := range svc.Deploy.Resources.Reservations.Devices {
		// compose-go reads count: all as -1.
		if d.Driver == "nvidia" && d.Count == -1 && slices.Contains(d.Capabilities, "gpu") {
			return true
		}
	}
	return false
}
