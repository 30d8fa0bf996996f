package inventory

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// Facts are the node-level parts of an inventory: everything but GPUs and
// driver versions.
type Facts struct {
	NodeID      string
	Hostname    string
	IP          string
	CPUs        int
	MemoryBytes uint64
	Labels      map[string]string
}

// Inventory returns an inventory of the facts with no GPUs.
func (f Facts) Inventory() NodeInventory {
	var labels map[string]string
	if len(f.Labels) > 0 {
		labels = make(map[string]string, len(f.Labels))
		for k, v := range f.Labels {
			labels[k] = v
		}
	}
	return NodeInventory{
		NodeID:      f.NodeID,
		Hostname:    f.Hostname,
		IP:          f.IP,
		CPUs:        f.CPUs,
		MemoryBytes: f.MemoryBytes,
		GPUs:        []GPU{},
		Labels:      labels,
	}
}

// FactsOptions are what the operator may override; empty fields are
// discovered.
type FactsOptions struct {
	NodeID string
	IP     string
	Labels map[string]string
	// ProcDir is where /proc lives; tests point it at a fixture.
	ProcDir string
}

// ErrNoDefaultRoute means the routing table has no default route, so the
// IP other nodes reach this one on cannot be guessed.
var ErrNoDefaultRoute = errors.New("no default route")

// LocalFacts discovers this node's facts. An IP that cannot be found is
// not fatal (a laptop off the network still reports, for --once); it comes
// back as ErrNoDefaultRoute alongside facts with IP 127.0.0.1, so the
// caller can warn.
func LocalFacts(opts FactsOptions) (Facts, error) {
	proc := opts.ProcDir
	if proc == "" {
		proc = "/proc"
	}
	host, err := os.Hostname()
	if err != nil {
		return Facts{}, fmt.Errorf("hostname: %w", err)
	}
	f := Facts{
		NodeID:   opts.NodeID,
		Hostname: host,
		IP:       opts.IP,
		CPUs:     runtime.NumCPU(),
		Labels:   opts.Labels,
	}
	if f.NodeID == "" {
		f.NodeID = host
	}
	if mem, err := readMemTotal(proc); err == nil {
		f.MemoryBytes = mem
	}
	var ipErr error
	if f.IP == "" {
		f.IP, ipErr = defaultRouteIP(proc)
		if ipErr != nil {
			f.IP = "127.0.0.1"
		}
	}
	return f, ipErr
}

func readMemTotal(proc string) (uint64, error) {
	file, err := os.Open(proc + "/meminfo")
	if err != nil {
		return 0, err
	}
	defer file.Close()
	return ParseMemTotal(file)
}

// ParseMemTotal reads MemTotal from a /proc/meminfo, in bytes.
func ParseMemTotal(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo MemTotal %q: %w", fields[1], err)
			}
			return kb * 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	return 0, errors.New("meminfo: no MemTotal line")
}

// ParseDefaultRoute returns the interface of the default route (the
// lowest-metric one) from a /proc/net/route table.
func ParseDefaultRoute(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	best, bestMetric := "", -1
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&0x1 == 0 { // RTF_UP
			continue
		}
		metric, err := strconv.Atoi(f[6])
		if err != nil {
			continue
		}
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = f[0], metric
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read route table: %w", err)
	}
	if best == "" {
		return "", ErrNoDefaultRoute
	}
	return best, nil
}

// defaultRouteIP is the first IPv4 address of the default route's
// interface: the address other nodes of a cluster reach this one on.
func defaultRouteIP(proc string) (string, error) {
	file, err := os.Open(proc + "/net/route")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoDefaultRoute, err)
	}
	defer file.Close()
	name, err := ParseDefaultRoute(file)
	if err != nil {
		return "", err
	}
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("default route interface %s: %w", name, err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", fmt.Errorf("default route interface %s has no IPv4 address", name)
}

// ParseLabels turns KEY=VALUE strings into a map. Keys follow
// planner.LabelKeyRule, values are at most MaxString bytes; a repeated
// key is an error rather than a silent overwrite.
func ParseLabels(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: want KEY=VALUE", planner.QuoteShort(kv))
		}
		if err := planner.LabelKeyRule.Check(k); err != nil {
			return nil, err
		}
		if len(v) > MaxString {
			return nil, fmt.Errorf("%s: a value of %d bytes; at most %d", k, len(v), MaxString)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%q: key %q given twice", kv, k)
		}
		out[k] = v
	}
	return out, nil
}

// NoGPUs is a Source of a node without GPUs (or without NVML): its facts
// only. It never changes.
type NoGPUs struct{ Facts Facts }

// Inventory implements Source.
func (s NoGPUs) Inventory(context.Context) (NodeInventory, error) {
	return s.Facts.Inventory(), nil
}

// Changed implements Source.
func (s NoGPUs) Changed() <-chan struct{} { return nil }
