package auth

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
)

// TestOpenKeepsKeys: the keys are made once, owner-only, and the same
// authority comes back from them.
func TestOpenKeepsKeys(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.AccountKey != b.AccountKey || a.SystemKey != b.SystemKey || a.Operator().Subject != b.Operator().Subject {
		t.Fatal("a second Open made other keys")
	}
	for _, name := range keyFiles {
		fi, err := os.Stat(filepath.Join(dir, "auth", name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", name, err, fi.Mode())
		}
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrNoKeys) {
		t.Errorf("Load where there are no keys: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, "auth"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "owner's only") {
		t.Errorf("keys in a directory others can read: %v", err)
	}
	_ = os.Chmod(filepath.Join(dir, "auth"), 0o700)
	if err := os.WriteFile(filepath.Join(dir, "auth", "account.nk"), []byte("SUnotaseed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "account.nk") {
		t.Errorf("a damaged key: %v", err)
	}
}

// TestCreds: each role's credentials say who they are, are signed by the
// account, and carry that role's permissions; a reporter's name one key.
func TestCreds(t *testing.T) {
	a, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role      Role
		node      string
		pub, deny []string // subjects it may publish to, and may not
	}{
		{Reporter, "gpu-07.example", []string{"$KV.poolplanner-inventory.gpu-07.example"}, []string{"$KV.poolplanner-inventory.gpu-08", "poolplanner.plans.default", "$JS.API.STREAM.DELETE.KV_poolplanner-inventory"}},
		{Launcher, "", []string{"poolplanner.lookup", "$JS.API.DIRECT.GET.POOLPLANNER_PLANS"}, []string{"poolplanner.plans.default", "$KV.poolplanner-specs.default", "$JS.API.STREAM.PURGE.POOLPLANNER_PLANS"}},
		{Admin, "", []string{"$KV.poolplanner-specs.default", "poolplanner.validate"}, []string{"poolplanner.plans.default", "$KV.poolplanner-inventory.n1", "$JS.API.STREAM.DELETE.POOLPLANNER_PLANS"}},
		{Planner, "", []string{"poolplanner.plans.default", "$JS.API.STREAM.CREATE.POOLPLANNER_PLANS"}, nil},
	} {
		t.Run(string(c.role), func(t *testing.T) {
			creds, err := a.Creds(c.role, c.node, 0)
			if err != nil {
				t.Fatal(err)
			}
			id, err := IdentityOf(creds)
			if err != nil || id.Role != c.role || id.Node != c.node {
				t.Fatalf("identity %+v, %v", id, err)
			}
			token, _ := jwt.ParseDecoratedJWT(creds)
			uc, err := jwt.DecodeUserClaims(token)
			want := a.ClientsKey
			if c.role == Planner {
				want = a.AccountKey
			}
			if err != nil || uc.Issuer != want || !a.Current(creds) {
				t.Fatalf("issuer %s, %v", uc.Issuer, err)
			}
			if len(token) > 3000 {
				t.Errorf("user JWT of %d bytes: a server's CONNECT line is 4 KB by default", len(token))
			}
			for _, s := range c.pub {
				if !allowed(uc.Pub.Allow, s) {
					t.Errorf("may not publish to %s", s)
				}
			}
			for _, s := range c.deny {
				if allowed(uc.Pub.Allow, s) {
					t.Errorf("may publish to %s", s)
				}
			}
			if c.role != Planner && (allowed(uc.Sub.Allow, "poolplanner.lookup") || allowed(uc.Sub.Allow, "poolplanner.validate")) {
				t.Error("may answer the service")
			}
			// Readers listen on inboxes only: a push consumer's deliveries
			// to a stream's subject must find no audience.
			for _, s := range []string{"poolplanner.plans.default", "poolplanner.assignments.default.n1", "$KV.poolplanner-inventory.n1", "$O.poolplanner-plans.C.x"} {
				if c.role != Planner && allowed(uc.Sub.Allow, s) {
					t.Errorf("may subscribe to %s", s)
				}
			}
			if c.role == Reporter && (allowed(uc.Sub.Allow, "_INBOX.abc") || !allowed(uc.Sub.Allow, id.Inbox+".x")) {
				t.Errorf("reporter inboxes %v, identity inbox %s", uc.Sub.Allow, id.Inbox)
			}
		})
	}
	if creds, err := a.Creds(Launcher, "", time.Hour); err != nil {
		t.Fatal(err)
	} else if token, _ := jwt.ParseDecoratedJWT(creds); token != "" {
		if uc, _ := jwt.DecodeUserClaims(token); uc == nil || uc.Expires < time.Now().Add(59*time.Minute).Unix() {
			t.Errorf("credentials for an hour expire at %v", uc)
		}
	}
	if _, err := a.Creds(Reporter, "", 0); err == nil {
		t.Error("a reporter's credentials without a node")
	}
	if _, err := a.Creds(Launcher, "n1", 0); err == nil {
		t.Error("a launcher's credentials with a node")
	}
	if _, err := ParseRole("root"); err == nil {
		t.Error("role root accepted")
	}
	conf := a.ServerConfig()
	for _, want := range []string{"operator: " + a.OperatorJWT, "system_account: " + a.SystemKey, "resolver: MEMORY", a.AccountKey + ": " + a.AccountJWT} {
		if !strings.Contains(conf, want) {
			t.Errorf("server config lacks %.60s", want)
		}
	}
}

// allowed says whether subject matches one of the patterns, as NATS
// matches them (* one token, > the rest).
func allowed(patterns []string, subject string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool {
		pt, st := strings.Split(p, "."), strings.Split(subject, ".")
		for i, tok := range pt {
			switch {
			case tok == ">":
				return len(st) > i
			case i >= len(st):
				return false
			case tok != "*" && tok != st[i]:
				return false
			}
		}
		return len(pt) == len(st)
	})
}

// TestClientsAccountAdded: keys made before the clients' account (no
// split file) get it on their next Open, the same on every host given
// the keys (derived from the account's); credentials of that time (every
// role in the planner's account) no longer count as current, and the
// planner's account revokes its users signed before then. Fresh keys
// revoke nobody.
func TestClientsAccountAdded(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.splitAt != 0 {
		t.Errorf("fresh keys revoke users signed before %d", a.splitAt)
	}
	old := *a
	old.clients = a.account // as every role was signed before
	launcher, err := old.Creds(Launcher, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "auth", splitFile)); err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.ClientsKey != a.ClientsKey || b.AccountKey != a.AccountKey || b.ClientsKey == b.AccountKey {
		t.Fatal("the clients' account key is not the one derived from the account's")
	}
	if b.Current(launcher) {
		t.Error("a launcher signed by the planner's account counts as current")
	}
	ac, err := jwt.DecodeAccountClaims(b.AccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := ac.Revocations[jwt.All]; !ok || at != b.splitAt || at > time.Now().Unix() {
		t.Errorf("revocations %v, split at %d", ac.Revocations, b.splitAt)
	}
	c, err := Load(dir) // the same split, read back
	if err != nil || c.splitAt != b.splitAt || c.ClientsKey != b.ClientsKey {
		t.Fatalf("Load: %v, split %d, want %d", err, c.splitAt, b.splitAt)
	}
	fresh, _ := c.Creds(Launcher, "", 0)
	if !c.Current(fresh) {
		t.Error("fresh launcher credentials are not current")
	}
	// A planner's credentials signed up to the split are not current.
	c.splitAt = time.Now().Unix() + 60
	planner, _ := c.Creds(Planner, "", 0)
	if c.Current(planner) {
		t.Error("planner credentials signed before the split count as current")
	}
}
