package bus

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/poolplanner/poolplanner/client"
)

// TestHistoryElsewhere: a data directory whose plan history sits under
// another account than the one served now is noticed; one whose own
// account has history, or none at all, is not.
func TestHistoryElsewhere(t *testing.T) {
	stream := func(dir, acc string) {
		if err := os.MkdirAll(filepath.Join(dir, "jetstream", acc, "streams", client.PlansStream), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		have    []string
		serving string
		want    []string
	}{
		{"empty", nil, "AKEY", nil},
		{"open before, auth now", []string{OpenAccount}, "AKEY", []string{OpenAccount}},
		{"auth before, open now", []string{"AKEY"}, OpenAccount, []string{"AKEY"}},
		{"history here too", []string{OpenAccount, "AKEY"}, "AKEY", nil},
		{"same account", []string{"AKEY"}, "AKEY", nil},
	} {
		dir := t.TempDir()
		for _, acc := range c.have {
			stream(dir, acc)
		}
		if got := HistoryElsewhere(dir, c.serving); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
