package inventory

import (
	"encoding/json"
	"time"

	"github.com/poolplanner/poolplanner/internal/jsonscan"
)

// Decode reads a NodeInventory document as json.Unmarshal into a zero
// NodeInventory does, value and error alike, without reflection: the
// planner reads 20,000 of them at its start, and encoding/json spent
// most of a second there. It reads the documents reporters write
// (known fields spelled as they are, once each, strings without
// escapes, integers as integers, no null) itself, and hands anything
// else to encoding/json, so that every error, and every value an odd
// document gives, is encoding/json's.
func Decode(data []byte, inv *NodeInventory) error {
	return DecodeShared(data, inv, nil)
}

// DecodeShared is Decode, with the strings documents repeat from node to
// node taken from shared (nil: none shared). Values are the same.
func DecodeShared(data []byte, inv *NodeInventory, shared *Strings) error {
	var fresh NodeInventory
	d := decoder{Scanner: jsonscan.Scanner{Data: data}, shared: shared}
	if d.node(&fresh) && d.End() {
		*inv = fresh
		return nil
	}
	fresh = NodeInventory{}
	err := json.Unmarshal(data, &fresh)
	*inv = fresh
	return err
}

// decoder is Decode's fast path: each method reads one value at its
// position and says whether it could (false: leave the document to
// encoding/json).
type decoder struct {
	jsonscan.Scanner
	shared *Strings
}

// common reads a string that documents repeat from node to node, the
// shared copy where there is one.
func (d *decoder) common(out *string) bool {
	s, ok := d.Raw()
	if ok {
		*out = d.shared.of(s)
	}
	return ok
}

func (d *decoder) uint32(out *uint32) bool {
	var n uint64
	ok := d.Uint(&n, 32)
	*out = uint32(n)
	return ok
}

func (d *decoder) node(n *NodeInventory) bool {
	return d.Object(12, func(key []byte) bool {
		switch string(key) {
		case "node_id":
			return d.Str(&n.NodeID)
		case "hostname":
			return d.Str(&n.Hostname)
		case "ip":
			return d.Str(&n.IP)
		case "cpus":
			return d.Int(&n.CPUs)
		case "memory_bytes":
			return d.Uint(&n.MemoryBytes, 64)
		case "gpus":
			n.GPUs = []GPU{}
			return d.Array(func() bool {
				n.GPUs = append(n.GPUs, GPU{})
				return d.gpu(&n.GPUs[len(n.GPUs)-1])
			})
		case "labels":
			n.Labels = map[string]string{}
			return d.Object(0, func(k []byte) bool {
				var v string
				ok := d.common(&v)
				n.Labels[d.shared.of(k)] = v
				return ok
			})
		case "driver_version":
			return d.common(&n.DriverVersion)
		case "reported_at":
			return d.time(&n.ReportedAt)
		case "cuda_driver_version":
			return d.common(&n.CUDADriverVersion)
		case "reporter":
			return d.common(&n.Reporter)
		case "reporter_pid":
			return d.Int(&n.ReporterPID)
		}
		return false
	})
}

// time reads a time as time.Time's UnmarshalJSON does, given the
// quoted string it would be given.
func (d *decoder) time(t *time.Time) bool {
	d.Space()
	start := d.Pos
	if _, ok := d.Raw(); !ok {
		return false
	}
	return t.UnmarshalJSON(d.Data[start:d.Pos]) == nil
}

func (d *decoder) gpu(g *GPU) bool {
	return d.Object(12, func(key []byte) bool {
		switch string(key) {
		case "index":
			return d.Int(&g.Index)
		case "uuid":
			return d.Str(&g.UUID)
		case "name":
			return d.common(&g.Name)
		case "memory_bytes":
			return d.Uint(&g.MemoryBytes, 64)
		case "pci_bus_id":
			return d.common(&g.PCIBusID)
		case "healthy":
			return d.Bool(&g.Healthy)
		case "unhealthy_reason":
			return d.common(&g.UnhealthyReason)
		case "numa_node":
			var n int
			ok := d.Int(&n)
			g.NUMANode = d.shared.numa(n)
			return ok
		case "mig_enabled":
			return d.Bool(&g.MIGEnabled)
		case "nvlink_peers":
			d.Space()
			start := d.Pos
			var buf [16]int
			peers := buf[:0]
			if !d.Array(func() bool {
				var p int
				ok := d.Int(&p)
				peers = append(peers, p)
				return ok
			}) {
				return false
			}
			g.NVLinkPeers = d.shared.ints(d.Data[start:d.Pos], peers)
			return true
		case "fabric":
			g.Fabric = &Fabric{}
			return d.Object(2, func(k []byte) bool {
				switch string(k) {
				case "cluster_uuid":
					return d.common(&g.Fabric.ClusterUUID)
				case "clique_id":
					return d.uint32(&g.Fabric.CliqueID)
				}
				return false
			})
		case "processes":
			g.Processes = []Process{}
			return d.Array(func() bool {
				g.Processes = append(g.Processes, Process{})
				return d.process(&g.Processes[len(g.Processes)-1])
			})
		}
		return false
	})
}

func (d *decoder) process(p *Process) bool {
	return d.Object(3, func(key []byte) bool {
		switch string(key) {
		case "pid":
			return d.uint32(&p.PID)
		case "used_memory_bytes":
			return d.Uint(&p.UsedMemoryBytes, 64)
		case "name":
			return d.Str(&p.Name)
		}
		return false
	})
}
