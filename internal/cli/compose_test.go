package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/poolplanner/poolplanner/internal/inventory"
)

// composeFiles are the repository's compose files: one host, and the
// highly available cluster.
var composeFiles = []string{"../../docker-compose.yaml", "../../docker-compose.ha.yaml"}

// eachCompose runs check on every compose file, loaded.
func eachCompose(t *testing.T, check func(t *testing.T, p *types.Project)) {
	for _, file := range composeFiles {
		t.Run(filepath.Base(file), func(t *testing.T) { check(t, loadCompose(t, file)) })
	}
}

// loadCompose loads composeFile the way `docker compose` does (schema
// validation, interpolation with an empty environment so defaults apply,
// normalization), offline and without a docker engine.
func loadCompose(t *testing.T, composeFile string) *types.Project {
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

// TestComposePlannerFlags checks every compose service that runs the
// planner: its subcommand exists and every flag and value in its command
// is one the real command tree accepts.
func TestComposePlannerFlags(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		n := 0
		for _, name := range p.ServiceNames() {
			svc := p.Services[name]
			if len(svc.Command) == 0 || svc.Command[0] != "planner" {
				continue
			}
			n++
			t.Run(name, func(t *testing.T) {
				checkPlannerArgs(t, svc.Command[1:])
			})
		}
		if n == 0 {
			t.Fatalf("%s: no service runs planner", p.Name)
		}
	})
}

// checkPlannerArgs fails t unless args is a command line the planner
// accepts: a runnable subcommand, known flags with valid values, and the
// positional arguments the subcommand takes.
func checkPlannerArgs(t *testing.T, args []string) {
	t.Helper()
	root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil {
		t.Fatalf("planner %s: %v", strings.Join(args, " "), err)
	}
	if cmd == root || !cmd.Runnable() {
		t.Fatalf("planner %s: %q is not a runnable subcommand", strings.Join(args, " "), cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%s %s: %v", cmd.CommandPath(), strings.Join(rest, " "), err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		t.Fatalf("%s %s: %v", cmd.CommandPath(), strings.Join(rest, " "), err)
	}
}

// TestComposePlannerSpecMounted checks that a planner's --spec names a
// file the service mounts, and that the mounted file is a spec the planner
// loads.
func TestComposePlannerSpecMounted(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range p.ServiceNames() {
			svc := p.Services[name]
			if len(svc.Command) < 2 || svc.Command[0] != "planner" || svc.Command[1] != "serve" {
				continue
			}
			root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
			cmd, rest, err := root.Find(svc.Command[1:])
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Fatal(err)
			}
			spec, _ := cmd.Flags().GetString("spec")
			if spec == "" {
				continue
			}
			var src string
			for _, v := range svc.Volumes {
				if v.Target == spec {
					src = v.Source
				}
			}
			if src == "" {
				t.Errorf("service %s: --spec %s is not mounted", name, spec)
				continue
			}
			if _, err := os.Stat(src); err != nil {
				t.Errorf("service %s: spec source %s: %v", name, filepath.Base(src), err)
				continue
			}
			if _, err := loadSpec(src); err != nil {
				t.Errorf("service %s: spec %s: %v", name, src, err)
			}
		}
	})
}

// TestComposeServersAreServices checks that --server URLs name a service
// of the project on NATS's port, so the containers find each other.
func TestComposeServersAreServices(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range p.ServiceNames() {
			cmd := p.Services[name].Command
			for i, a := range cmd {
				var urls string
				switch {
				case a == "--server" && i+1 < len(cmd):
					urls = cmd[i+1]
				case strings.HasPrefix(a, "--server="):
					urls = strings.TrimPrefix(a, "--server=")
				default:
					continue
				}
				for url := range strings.SplitSeq(urls, ",") {
					host, port, ok := strings.Cut(strings.TrimPrefix(url, "nats://"), ":")
					if p.Services[name].NetworkMode == "host" {
						// On the host's network: a port a NATS service publishes.
						if host != "127.0.0.1" || !publishedPort(p, port) {
							t.Errorf("service %s (host network): --server %s: want nats://127.0.0.1:PORT with PORT one a NATS service publishes", name, url)
						}
						continue
					}
					if _, isSvc := p.Services[host]; !ok || !isSvc || port != "4222" {
						t.Errorf("service %s: --server %s: want nats://SERVICE:4222 with SERVICE one of %v", name, url, p.ServiceNames())
					}
				}
			}
		}
	})
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
		t.Fatalf("%s: no service runs reporter", p.Name)
	}
	return out
}

// TestComposeReporterFlags runs each compose reporter command through the
// real command: every flag must be known (checked with --help, which
// parses the flags and stops), and the values must pass the reporter's
// own checks (checked with --once --simulate, which validates everything
// and prints the inventory without NATS).
func TestComposeReporterFlags(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range reporterServices(t, p) {
			args := []string(p.Services[name].Command[1:])
			t.Run(name, func(t *testing.T) {
				line := "reporter " + strings.Join(args, " ")
				code, _, stderr := reporterCmd(t, append(slices.Clone(args), "--help")...)
				if code != ExitOK {
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
				code, stdout, stderr := reporterCmd(t, once...)
				if code != ExitOK {
					t.Fatalf("%s: exit %d: %s", strings.Join(once, " "), code, stderr)
				}
				var inv inventory.NodeInventory
				if err := json.NewDecoder(bytes.NewReader([]byte(stdout))).Decode(&inv); err != nil {
					t.Fatalf("%s: stdout is not a NodeInventory: %v", line, err)
				}
			})
		}
	})
}

// TestComposeReporterGPUs checks that each reporter service that reads
// NVML (no --simulate) reserves every NVIDIA GPU of its host.
func TestComposeReporterGPUs(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range reporterServices(t, p) {
			svc := p.Services[name]
			if slices.ContainsFunc(svc.Command, func(a string) bool { return a == "--simulate" || strings.HasPrefix(a, "--simulate=") }) {
				continue
			}
			if !hasNvidiaReservation(svc) {
				t.Errorf("service %s reads NVML but does not reserve GPUs; want deploy.resources.reservations.devices: [{driver: nvidia, count: all, capabilities: [gpu]}]", name)
			}
		}
	})
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

// reporterCmd runs the reporter command in-process.
func reporterCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = ReporterMain(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestComposeSecretsSplit: the signing keys stay with the service that
// makes credentials; every other service mounts only its own secret.
func TestComposeSecretsSplit(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range p.ServiceNames() {
			svc := p.Services[name]
			var want string
			switch {
			case strings.HasPrefix(svc.Image, "nats:"):
				want = "nats-auth"
			case len(svc.Command) > 1 && svc.Command[0] == "planner" && svc.Command[1] == "serve":
				want = "planner-creds"
			case len(svc.Command) > 0 && svc.Command[0] == "reporter":
				want = "reporter-creds"
			}
			for _, v := range svc.Volumes {
				if v.Type != types.VolumeTypeVolume || strings.HasPrefix(v.Source, "nats-data") {
					continue
				}
				if name == "auth-init" {
					continue
				}
				if v.Source != want {
					t.Errorf("service %s mounts volume %s; it may have only %q", name, v.Source, want)
				}
				if !v.ReadOnly {
					t.Errorf("service %s mounts its secret %s writable", name, v.Source)
				}
			}
		}
	})
}

// TestComposeHA: the highly available compose file runs three NATS
// servers of one cluster config and at least two planners that know
// every server and keep three replicas.
func TestComposeHA(t *testing.T) {
	p := loadCompose(t, "../../docker-compose.ha.yaml")
	var servers, planners []string
	for _, name := range p.ServiceNames() {
		svc := p.Services[name]
		if strings.HasPrefix(svc.Image, "nats:") {
			servers = append(servers, name)
			if svc.Environment["SERVER_NAME"] == nil || *svc.Environment["SERVER_NAME"] != name {
				t.Errorf("service %s: SERVER_NAME must be the service's name (the routes name the services)", name)
			}
		}
		if len(svc.Command) > 1 && svc.Command[0] == "planner" && svc.Command[1] == "serve" {
			planners = append(planners, name)
			line := strings.Join(svc.Command, " ")
			if !strings.Contains(line, "--replicas 3") || !strings.Contains(line, "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222") {
				t.Errorf("service %s: want --replicas 3 and every server's URL: %s", name, line)
			}
		}
	}
	if len(servers) != 3 || len(planners) < 2 {
		t.Errorf("servers %v, planners %v: want three servers and at least two planners", servers, planners)
	}
}

// publishedPort reports whether a NATS service of p publishes port on
// the host (for its client port 4222).
func publishedPort(p *types.Project, port string) bool {
	for _, svc := range p.Services {
		for _, pc := range svc.Ports {
			if pc.Published == port && pc.Target == 4222 {
				return true
			}
		}
	}
	return false
}

// TestComposeOneHost: docker-compose.yaml makes a valid plan on the one
// host it runs on (its spec fits a node of 8 GPUs and 16 CPUs), and its
// reporters report the host's IP (host network, or --ip), not a
// container's.
func TestComposeOneHost(t *testing.T) {
	eachCompose(t, func(t *testing.T, p *types.Project) {
		for _, name := range reporterServices(t, p) {
			svc := p.Services[name]
			if svc.NetworkMode != "host" && !slices.ContainsFunc(svc.Command, func(a string) bool { return a == "--ip" || strings.HasPrefix(a, "--ip=") }) {
				t.Errorf("service %s reports its container's IP: give it network_mode: host or --ip", name)
			}
		}
	})
	p := loadCompose(t, "../../docker-compose.yaml")
	host := writeFile(t, "host.json", `{"node_id_to_resources": {"host": {"ip": "10.0.0.1", "CPU": 16, "GPU": 8}}}`)
	for _, name := range p.ServiceNames() {
		svc := p.Services[name]
		for _, v := range svc.Volumes {
			if v.Target == "/etc/poolplanner/spec.yaml" {
				if code, _, errOut := run(t, "plan", "--inventory", host, "--spec", v.Source); code != 0 {
					t.Errorf("service %s: its spec %s does not fit one 8-GPU, 16-CPU host: %s", name, filepath.Base(v.Source), errOut)
				}
			}
		}
	}
}
