package bus

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/auth"
)

// TestExpired: credentials past their expiry are refused before they
// reach a server (which would take them for the rest of that second and
// then close the connection), and only those.
func TestExpired(t *testing.T) {
	a, err := auth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	write := func(role auth.Role, node string, expires time.Duration) Security {
		t.Helper()
		data, err := a.Creds(role, node, expires)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "x.creds")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return Security{Creds: path}
	}
	expiring := write(auth.Reporter, "n1", time.Hour)
	id, err := expiring.Identity()
	if err != nil || id.Expires.IsZero() {
		t.Fatalf("identity %+v: %v", id, err)
	}
	forever := write(auth.Launcher, "", 0)
	for _, c := range []struct {
		name string
		sec  Security
		now  time.Time
		want string // "": accepted
	}{
		{"no credentials", Security{}, time.Now(), ""},
		{"never expire", forever, time.Now().Add(1000 * time.Hour), ""},
		{"before the expiry", expiring, id.Expires.Add(-time.Nanosecond), ""},
		{"at the expiry", expiring, id.Expires, "credentials expired: the reporter of node n1"},
		{"after the expiry", expiring, id.Expires.Add(time.Minute), "`planner creds reporter --node-id n1` makes new ones"},
		{"unreadable: left to Options", Security{Creds: filepath.Join(t.TempDir(), "missing")}, time.Now(), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.sec.Expired(c.now)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	// Connect says so without dialling: nothing listens on the URL.
	if _, err := Connect("nats://127.0.0.1:1", "t", zerolog.Nop(), write(auth.Reporter, "n1", time.Nanosecond)); err == nil ||
		!strings.Contains(err.Error(), "credentials expired") {
		t.Fatalf("Connect with expired credentials: %v", err)
	}
}
