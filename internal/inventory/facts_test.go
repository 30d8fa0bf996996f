package inventory

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseDefaultRoute(t *testing.T) {
	const header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
	tests := []struct {
		name, table, want string
		wantErr           error
	}{
		{name: "one default", want: "eth0", table: header +
			"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
			"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"},
		{name: "lowest metric wins", want: "ib0", table: header +
			"wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
			"ib0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"},
		{name: "down route skipped", want: "eth1", table: header +
			"eth0\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n" +
			"eth1\t00000000\t010200C0\t0003\t0\t0\t50\t00000000\t0\t0\t0\n"},
		{name: "no default", wantErr: ErrNoDefaultRoute, table: header +
			"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"},
		{name: "empty", wantErr: ErrNoDefaultRoute},
	}
	for _, tt := range tests {
		got, err := ParseDefaultRoute(strings.NewReader(tt.table))
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseMemTotal(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "MemTotal:       16318668 kB\nMemFree: 1 kB\n", want: 16318668 * 1024},
		{in: "MemFree: 1 kB\n", wantErr: true},
		{in: "MemTotal: lots kB\n", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseMemTotal(strings.NewReader(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMemTotal(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels([]string{"zone=a", "rack=r1=x", "empty="})
	if err != nil {
		t.Fatal(err)
	}
	if got["zone"] != "a" || got["rack"] != "r1=x" || got["empty"] != "" || len(got) != 3 {
		t.Errorf("got %v", got)
	}
	for _, c := range []struct {
		bad  []string
		want string
	}{
		{[]string{"novalue"}, `"novalue": want KEY=VALUE`},
		{[]string{"=v"}, "want KEY=VALUE"},
		{[]string{"a=1", "a=2"}, `key "a" given twice`},
		{[]string{"a b=1"}, `invalid label key "a b": ' ' at byte 1 is not allowed; want 1 to 253 bytes`},
		{[]string{"zone.=a"}, `invalid label key "zone.": '.' at byte 4`},
		{[]string{strings.Repeat("k", 254) + "=v"}, "254 bytes is too long"},
		{[]string{"k=" + strings.Repeat("v", MaxString+1)}, "k: a value of 1025 bytes; at most 1024"},
	} {
		if _, err := ParseLabels(c.bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseLabels(%.40q): %v, want %q", c.bad, err, c.want)
		}
	}
	if got, err := ParseLabels(nil); got != nil || err != nil {
		t.Errorf("ParseLabels(nil) = %v, %v", got, err)
	}
}

func TestLocalFacts(t *testing.T) {
	proc := t.TempDir()
	os.MkdirAll(filepath.Join(proc, "net"), 0o755)
	os.WriteFile(filepath.Join(proc, "meminfo"), []byte("MemTotal: 1024 kB\n"), 0o644)
	// No default route in the fixture: facts still come back, with a
	// loopback IP and an error to warn about.
	os.WriteFile(filepath.Join(proc, "net", "route"), []byte("Iface\tDestination\n"), 0o644)

	f, err := LocalFacts(FactsOptions{ProcDir: proc, Labels: map[string]string{"a": "b"}})
	if !errors.Is(err, ErrNoDefaultRoute) {
		t.Errorf("error = %v, want ErrNoDefaultRoute", err)
	}
	host, _ := os.Hostname()
	if f.NodeID != host || f.Hostname != host || f.IP != "127.0.0.1" || f.MemoryBytes != 1024*1024 || f.CPUs < 1 || f.Labels["a"] != "b" {
		t.Errorf("facts = %+v", f)
	}

	f, err = LocalFacts(FactsOptions{ProcDir: proc, NodeID: "n7", IP: "10.1.2.3"})
	if err != nil || f.NodeID != "n7" || f.IP != "10.1.2.3" {
		t.Errorf("overrides: facts = %+v, err %v", f, err)
	}
}
