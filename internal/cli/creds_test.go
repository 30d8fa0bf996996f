package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/poolplanner/poolplanner/internal/auth"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

func TestCredsCommands(t *testing.T) {
	dir := t.TempDir()
	// Signing needs keys made by serve --auth or auth init: a wrong
	// --data-dir is an error, not a new authority nobody trusts.
	if code, _, errOut := run(t, "creds", "launcher", "--data-dir", dir); code != 1 || !strings.Contains(errOut, "no keys yet") {
		t.Fatalf("creds without keys: exit %d: %s", code, errOut)
	}
	if code, _, errOut := run(t, "auth", "init", "--data-dir", dir); code != 0 {
		t.Fatal(errOut)
	}
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"creds", "launcher", "--data-dir", dir}, 0, "BEGIN NATS USER JWT"},
		{[]string{"creds", "reporter", "--node-id", "n1", "--data-dir", dir}, 0, "BEGIN USER NKEY SEED"},
		{[]string{"creds", "reporter", "--data-dir", dir}, 2, "pass --node-id"},
		{[]string{"creds", "admin", "--node-id", "n1", "--data-dir", dir}, 2, "reporter's credentials only"},
		{[]string{"creds", "root", "--data-dir", dir}, 2, "want one of admin, planner, launcher, reporter"},
		{[]string{"creds", "reporter", "--node-id", "a b", "--data-dir", dir}, 2, "invalid node id"},
		{[]string{"creds", "launcher", "--expires", "1h", "--data-dir", dir}, 0, "BEGIN NATS USER JWT"},
		{[]string{"creds", "launcher", "--expires", "-1h", "--data-dir", dir}, 2, "must be >= 0"},
		{[]string{"creds", "launcher", "--expires", "30d", "--data-dir", dir}, 0, "BEGIN NATS USER JWT"},
		{[]string{"creds", "launcher", "--expires", "30x", "--data-dir", dir}, 2, "want a duration such as"},
	} {
		code, out, errOut := run(t, c.args...)
		if code != c.code || !strings.Contains(out+errOut, c.out) {
			t.Errorf("%v: exit %d, stdout %.80q, stderr %q", c.args, code, out, errOut)
		}
	}
	// A secret is written for its owner's eyes only: to --output, or to
	// a file a shell redirect made.
	secret := filepath.Join(t.TempDir(), "launcher.creds")
	if err := os.WriteFile(secret, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "creds", "launcher", "--data-dir", dir, "--output", secret); code != 0 || out != "" {
		t.Fatalf("--output: exit %d %q %q", code, out, errOut)
	}
	if fi, err := os.Stat(secret); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("--output file: %v %v", fi.Mode(), err)
	}
	if data, _ := os.ReadFile(secret); !strings.Contains(string(data), "BEGIN NATS USER JWT") {
		t.Errorf("--output file holds %q", data)
	}
	redirect, err := os.OpenFile(filepath.Join(t.TempDir(), "x.creds"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ownerOnly(redirect)
	if fi, err := redirect.Stat(); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("redirected stdout: %v %v", fi.Mode(), err)
	}
	redirect.Close()

	code, out, errOut := run(t, "auth", "init", "--data-dir", dir, "--reporter", "n1", "--reporter", "rack/7")
	if code != 0 {
		t.Fatalf("auth init: exit %d: %s", code, errOut)
	}
	for _, name := range []string{"nats-auth.conf", "creds/admin.creds", "creds/planner.creds", "creds/launcher.creds", "creds/reporter-n1.creds", "creds/reporter-rack_7.creds"} {
		if !strings.Contains(out, filepath.Join(dir, name)) {
			t.Errorf("auth init does not list %s:\n%s", name, out)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "creds", "reporter-rack_7.creds"))
	if err != nil {
		t.Fatal(err)
	}
	if id, err := auth.IdentityOf(data); err != nil || id.Role != auth.Reporter || id.Node != "rack/7" {
		t.Errorf("reporter-rack_7.creds: %+v %v", id, err)
	}
	// --export: one file, somewhere else, for the one who needs it.
	out2 := t.TempDir()
	code, _, errOut = run(t, "auth", "init", "--data-dir", dir, "--export", "reporter:n7="+filepath.Join(out2, "r", "reporter.creds"),
		"--export", "server-config="+filepath.Join(out2, "nats", "nats-auth.conf"))
	if code != 0 {
		t.Fatal(errOut)
	}
	if data, err := os.ReadFile(filepath.Join(out2, "r", "reporter.creds")); err != nil {
		t.Fatal(err)
	} else if id, err := auth.IdentityOf(data); err != nil || id.Node != "n7" {
		t.Errorf("exported reporter credentials: %+v %v", id, err)
	}
	if data, err := os.ReadFile(filepath.Join(out2, "nats", "nats-auth.conf")); err != nil || !strings.Contains(string(data), "resolver_preload") {
		t.Errorf("exported server config: %v", err)
	}
	for _, bad := range []string{"planner", "root=/x", "reporter=/x", "launcher:n1=/x"} {
		if code, _, _ := run(t, "auth", "init", "--data-dir", dir, "--export", bad); code != 2 {
			t.Errorf("--export %s: exit %d", bad, code)
		}
	}
	// Credentials handed out are kept: a second init leaves them.
	before, _ := os.ReadFile(filepath.Join(dir, "creds", "admin.creds"))
	if code, _, errOut := run(t, "auth", "init", "--data-dir", dir); code != 0 {
		t.Fatal(errOut)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "creds", "admin.creds")); string(after) != string(before) {
		t.Error("a second init rewrote admin.creds")
	}
}

// TestExportRewritesStale: auth init --export keeps a file that is
// current, and writes anew one the keys no longer honour: credentials
// of the old single account, a server configuration without the
// clients' account (what an upgraded compose volume holds).
func TestExportRewritesStale(t *testing.T) {
	dir := t.TempDir()
	if code, _, errOut := run(t, "auth", "init", "--data-dir", dir); code != 0 {
		t.Fatal(errOut)
	}
	out := t.TempDir()
	conf, creds := filepath.Join(out, "nats-auth.conf"), filepath.Join(out, "launcher.creds")
	export := func() {
		t.Helper()
		if code, _, errOut := run(t, "auth", "init", "--data-dir", dir, "--export", "server-config="+conf, "--export", "launcher="+creds); code != 0 {
			t.Fatal(errOut)
		}
	}
	export()
	keep, _ := os.ReadFile(creds)
	export()
	if again, _ := os.ReadFile(creds); string(again) != string(keep) {
		t.Error("current credentials were written anew")
	}
	for _, f := range []string{conf, creds} {
		if err := os.WriteFile(f, []byte("stale\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	export()
	a, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(conf); !strings.Contains(string(data), a.ClientsKey+":") {
		t.Errorf("a stale server configuration was kept: %q", data)
	}
	if data, _ := os.ReadFile(creds); !a.Current(data) {
		t.Errorf("stale credentials were kept: %q", data)
	}
}

// TestCredsNATSContext: creds --nats-context saves a nats CLI context
// (ADR-21's keys) naming the credentials, the server, the CA and the
// credentials' inbox prefix; with what it names, a request is answered,
// where the same credentials with NATS's default inbox get nothing.
func TestCredsNATSContext(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	addr := freeAddr(t)
	dataDir := t.TempDir()
	runServe(t, "--listen", addr, "--data-dir", dataDir, "--auth", "--spec", "../../examples/disaggregate.yaml",
		"--simulate", "4x8xH100", "--no-local-reporter")
	server := "nats://" + addr
	credsFile := filepath.Join(t.TempDir(), "launcher.creds")
	var code int
	var errOut string
	natstest.WaitFor(t, 30*time.Second, "serve --auth making its keys", func() bool {
		code, _, errOut = run(t, "creds", "launcher", "--data-dir", dataDir, "--output", credsFile, "--nats-context", "pp-launcher",
			"--server", server, "--tls-ca", "ca.pem")
		return code == 0
	})
	data, err := os.ReadFile(filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "nats", "context", "pp-launcher.json"))
	if err != nil {
		t.Fatalf("%v (creds: %s)", err, errOut)
	}
	var ctxFile map[string]any
	if err := json.Unmarshal(data, &ctxFile); err != nil {
		t.Fatal(err)
	}
	creds, _ := os.ReadFile(credsFile)
	id, err := auth.IdentityOf(creds)
	if err != nil {
		t.Fatal(err)
	}
	cwd, _ := os.Getwd()
	want := map[string]any{"url": server, "creds": credsFile, "ca": filepath.Join(cwd, "ca.pem"), "inbox_prefix": id.Inbox}
	for k, v := range want {
		if ctxFile[k] != v {
			t.Errorf("context %s = %v, want %v", k, ctxFile[k], v)
		}
	}
	for _, k := range []string{"description", "user", "password", "token", "nkey", "cert", "key", "nsc", "jetstream_domain", "jetstream_api_prefix", "jetstream_event_prefix", "user_jwt", "tls_first"} {
		if _, ok := ctxFile[k]; !ok {
			t.Errorf("context lacks key %s", k)
		}
	}
	if lines := strings.Split(string(creds), "\n"); len(lines) < 2 || !strings.Contains(lines[1], "--inbox-prefix "+id.Inbox) {
		t.Errorf("the creds file's second line does not give its inbox prefix:\n%s", creds)
	}
	// What a `nats --context pp-launcher req ...` does: connect with the
	// context's credentials and inbox prefix.
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server, "--creds", credsFile)
	lookup := []byte(`{"plan": "default", "component": "train", "index": 0}`)
	ask := func(opts ...nats.Option) error {
		nc, err := nats.Connect(server, append([]nats.Option{nats.UserCredentials(ctxFile["creds"].(string))}, opts...)...)
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.Request("poolplanner.lookup", lookup, 2*time.Second)
		return err
	}
	if err := ask(nats.CustomInboxPrefix(ctxFile["inbox_prefix"].(string))); err != nil {
		t.Errorf("a request with the context's inbox prefix: %v", err)
	}
	if err := ask(); err == nil {
		t.Error("a request with NATS's default inbox was answered: the inbox prefix is not needed, and the docs are wrong")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-context", "x"}, "pass --output FILE too"},
		{[]string{"--nats-context", "../x", "--output", credsFile}, "--nats-context \"../x\""},
	} {
		if code, _, errOut := run(t, append([]string{"creds", "launcher", "--data-dir", dataDir}, c.args...)...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d: %s", c.args, code, errOut)
		}
	}
}
