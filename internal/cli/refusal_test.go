package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// runFor runs a command (the reporter's, for args "reporter ...")
// until it exits or within passes (then code is -1): a refusal must end
// a long-running command by itself.
func runFor(t *testing.T, within time.Duration, args ...string) (code int, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	// The reporter logs from more than one goroutine.
	var out, errOut syncWriter
	if args[0] == "reporter" {
		code = ReporterMain(ctx, args[1:], &out, &errOut)
	} else {
		code = Main(ctx, args, nil, &out, &errOut)
	}
	if ctx.Err() != nil {
		code = -1
	}
	return code, errOut.String()
}

// TestRefusalsSaidOnce: credentials refused, expired (before or while
// a command runs) or foreign, and certificates that cannot be verified
// end client commands and the reporter with a non-zero exit and one
// line naming the cause, instead of retrying for ever ("NATS not
// reachable yet") or exiting 0 in silence; "pass --tls-ca" is advised
// only where it was not passed and the authority is unknown.
func TestRefusalsSaidOnce(t *testing.T) {
	caFile, certFile, keyFile := testCA(t)
	otherCA, _, _ := testCA(t)
	addr := freeAddr(t)
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var serveErr bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", dataDir, "--auth", "--tls-cert", certFile, "--tls-key", keyFile,
			"--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100", "--no-local-reporter", "--log-level", "warn"}, nil, &bytes.Buffer{}, &serveErr)
	}()
	defer func() { cancel(); <-done }()
	server := "nats://" + addr
	launcher := filepath.Join(dataDir, "creds", "launcher.creds")
	runUntil(t, 30*time.Second, func(code int, out string) bool { return code == 0 && strings.Contains(out, "first plan") },
		"history", "--server", server, "--creds", launcher, "--tls-ca", caFile)

	creds := func(dir string, expires time.Duration, role string, args ...string) string {
		t.Helper()
		a := append([]string{"creds", role, "--data-dir", dir}, args...)
		if expires > 0 {
			a = append(a, "--expires", expires.String())
		}
		code, out, errOut := run(t, a...)
		if code != 0 {
			t.Fatalf("creds: %d %s", code, errOut)
		}
		path := filepath.Join(t.TempDir(), role+".creds")
		if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	expiresAt := func(path string) time.Time {
		data, _ := os.ReadFile(path)
		id, err := auth.IdentityOf(data)
		if err != nil || id.Expires.IsZero() {
			t.Fatalf("%s: no expiry (%v)", path, err)
		}
		return id.Expires
	}
	expired := creds(dataDir, time.Second, "reporter", "--node-id", "n1")
	natstest.WaitFor(t, 5*time.Second, "the credentials expiring", func() bool { return !time.Now().Before(expiresAt(expired)) })
	otherDir := t.TempDir()
	if code, _, errOut := run(t, "auth", "init", "--data-dir", otherDir); code != 0 {
		t.Fatalf("auth init: %s", errOut)
	}
	foreign := creds(otherDir, 0, "reporter", "--node-id", "n1")
	reporter := func(creds string, tls ...string) []string {
		return append([]string{"reporter", "--server", server, "--creds", creds, "--node-id", "n1", "--simulate", "8xH100",
			"--heartbeat", "1s", "--log-level", "warn"}, tls...)
	}

	for _, c := range []struct {
		name    string
		args    []string
		want    string
		advises bool // says "pass --tls-ca"
	}{
		{"reporter, expired credentials", reporter(expired, "--tls-ca", caFile), "credentials expired", false},
		{"reporter, foreign credentials", reporter(foreign, "--tls-ca", caFile), "authorization violation: the server refused", false},
		{"reporter, TLS without --tls-ca", reporter(foreign), "signed by an authority this client does not trust", true},
		{"client, another CA", []string{"history", "--server", server, "--creds", launcher, "--tls-ca", otherCA},
			"not signed by the CA in --tls-ca " + otherCA, false},
		{"client, a name the certificate lacks", []string{"history", "--server", strings.Replace(server, "127.0.0.1", "localhost", 1),
			"--creds", launcher, "--tls-ca", caFile}, `not valid for "localhost"`, false},
		{"client, expired credentials", []string{"history", "--server", server, "--creds", creds(dataDir, time.Second, "launcher"), "--tls-ca", caFile},
			"", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.want == "" { // credentials made for a second: wait them out
				path := c.args[4]
				natstest.WaitFor(t, 5*time.Second, "the credentials expiring", func() bool { return !time.Now().Before(expiresAt(path)) })
				c.want = "credentials expired"
			}
			code, errOut := runFor(t, 20*time.Second, c.args...)
			checkRefusal(t, code, errOut, c.want, c.advises)
		})
	}

	// Credentials that expire while the command runs.
	for _, c := range []struct {
		name string
		args func(creds string) []string
		role string
	}{
		{"watch", func(creds string) []string {
			return []string{"watch", "--server", server, "--creds", creds, "--tls-ca", caFile}
		}, "launcher"},
		{"reporter", func(creds string) []string { return reporter(creds, "--tls-ca", caFile) }, "reporter"},
		// A planner on a server of its own (--server): a standby here,
		// whose lease reads and follows end with its credentials.
		{"serve --server", func(creds string) []string {
			return []string{"serve", "--server", server, "--creds", creds, "--tls-ca", caFile, "--no-local-reporter", "--log-level", "warn"}
		}, "planner"},
	} {
		t.Run(c.name+" as its credentials expire", func(t *testing.T) {
			var extra []string
			if c.role == "reporter" {
				extra = []string{"--node-id", "n1"}
			}
			path := creds(dataDir, 3*time.Second, c.role, extra...)
			code, errOut := runFor(t, 30*time.Second, c.args(path)...)
			if !time.Now().After(expiresAt(path)) {
				t.Errorf("ended before the credentials expired: exit %d: %s", code, errOut)
			}
			checkRefusal(t, code, errOut, "expired", false)
		})
	}
}

// checkRefusal: exited non-zero by itself, its last line naming the
// cause (the reporter logs before it), never "not reachable yet".
func checkRefusal(t *testing.T, code int, errOut, want string, advises bool) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	last := lines[len(lines)-1]
	t.Logf("exit %d: %s", code, last)
	switch {
	case code == -1:
		t.Fatalf("still running; stderr:\n%s", errOut)
	case code == 0:
		t.Fatalf("exit 0; stderr:\n%s", errOut)
	case !strings.Contains(last, want):
		t.Fatalf("last line %q, want %q; stderr:\n%s", last, want, errOut)
	case strings.Contains(errOut, "not reachable yet"):
		t.Errorf("said the server was not reachable:\n%s", errOut)
	case strings.Contains(last, "pass --tls-ca") != advises:
		t.Errorf("advises --tls-ca: %v, want %v: %q", !advises, advises, last)
	}
}
