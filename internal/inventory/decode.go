package inventory

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
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
	var fresh NodeInventory
	d := decoder{data: data}
	if d.node(&fresh) && d.end() {
		*inv = fresh
		return nil
	}
	fresh = NodeInventory{}
	err := json.Unmarshal(data, &fresh)
	*inv = fresh
	return err
}

// decoder is Decode's fast path: each method reads one value at pos
// and says whether it could (false: leave the document to
// encoding/json).
type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// end: nothing but space after the document.
func (d *decoder) end() bool {
	d.space()
	return d.pos == len(d.data)
}

// byte reads c, after space.
func (d *decoder) byte(c byte) bool {
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

// peek is the next byte after space (0 at the end).
func (d *decoder) peek() byte {
	d.space()
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

// raw reads a string without escapes or control characters, valid
// UTF-8, and returns its contents (quotes excluded).
func (d *decoder) raw() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start, ascii := d.pos, true
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			s := d.data[start:d.pos]
			d.pos++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		d.pos++
	}
	return nil, false
}

func (d *decoder) str(out *string) bool {
	s, ok := d.raw()
	if ok {
		*out = string(s)
	}
	return ok
}

// digits reads an integer literal as JSON writes one (no leading zeros,
// no fraction or exponent), with its sign.
func (d *decoder) digits() (neg bool, s []byte, ok bool) {
	d.space()
	start := d.pos
	if d.pos < len(d.data) && d.data[d.pos] == '-' {
		neg = true
		d.pos++
	}
	first := d.pos
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
	}
	n := d.pos - first
	if n == 0 || n > 1 && d.data[first] == '0' {
		return false, nil, false
	}
	if d.pos < len(d.data) {
		switch d.data[d.pos] {
		case '.', 'e', 'E':
			return false, nil, false
		}
	}
	return neg, d.data[start:d.pos], true
}

func (d *decoder) int(out *int) bool {
	_, s, ok := d.digits()
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(string(s), 10, strconv.IntSize)
	*out = int(n)
	return err == nil
}

func (d *decoder) uint(out *uint64, bits int) bool {
	neg, s, ok := d.digits()
	if !ok || neg {
		return false
	}
	n, err := strconv.ParseUint(string(s), 10, bits)
	*out = n
	return err == nil
}

func (d *decoder) uint32(out *uint32) bool {
	var n uint64
	ok := d.uint(&n, 32)
	*out = uint32(n)
	return ok
}

func (d *decoder) bool(out *bool) bool {
	d.space()
	switch {
	case hasPrefix(d.data[d.pos:], "true"):
		*out, d.pos = true, d.pos+4
	case hasPrefix(d.data[d.pos:], "false"):
		*out, d.pos = false, d.pos+5
	default:
		return false
	}
	return true
}

func hasPrefix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[:len(s)]) == s
}

// object reads an object, calling field with each key (the value is
// field's to read). In a struct's object (fields: the most keys it may
// hold) a key seen twice is left to encoding/json, which merges such
// values in ways not worth copying; a map's (fields 0) takes the last,
// as encoding/json does.
func (d *decoder) object(fields int, field func(key []byte) bool) bool {
	if !d.byte('{') {
		return false
	}
	if d.byte('}') {
		return true
	}
	var seen [16][]byte
	n := 0
	for {
		key, ok := d.raw()
		if !ok || !d.byte(':') {
			return false
		}
		if fields > 0 {
			for _, s := range seen[:n] {
				if string(s) == string(key) {
					return false
				}
			}
			if n == len(seen) || n == fields {
				return false
			}
			seen[n] = key
			n++
		}
		if !field(key) {
			return false
		}
		if d.byte('}') {
			return true
		}
		if !d.byte(',') {
			return false
		}
	}
}

// array reads an array, calling elem for each element.
func (d *decoder) array(elem func() bool) bool {
	if !d.byte('[') {
		return false
	}
	if d.byte(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.byte(']') {
			return true
		}
		if !d.byte(',') {
			return false
		}
	}
}

func (d *decoder) node(n *NodeInventory) bool {
	return d.object(12, func(key []byte) bool {
		switch string(key) {
		case "node_id":
			return d.str(&n.NodeID)
		case "hostname":
			return d.str(&n.Hostname)
		case "ip":
			return d.str(&n.IP)
		case "cpus":
			return d.int(&n.CPUs)
		case "memory_bytes":
			return d.uint(&n.MemoryBytes, 64)
		case "gpus":
			n.GPUs = []GPU{}
			return d.array(func() bool {
				n.GPUs = append(n.GPUs, GPU{})
				return d.gpu(&n.GPUs[len(n.GPUs)-1])
			})
		case "labels":
			n.Labels = map[string]string{}
			return d.object(0, func(k []byte) bool {
				var v string
				ok := d.str(&v)
				n.Labels[string(k)] = v
				return ok
			})
		case "driver_version":
			return d.str(&n.DriverVersion)
		case "reported_at":
			return d.time(&n.ReportedAt)
		case "cuda_driver_version":
			return d.str(&n.CUDADriverVersion)
		case "reporter":
			return d.str(&n.Reporter)
		case "reporter_pid":
			return d.int(&n.ReporterPID)
		}
		return false
	})
}

// time reads a time as time.Time's UnmarshalJSON does, given the
// quoted string it would be given.
func (d *decoder) time(t *time.Time) bool {
	d.space()
	start := d.pos
	if _, ok := d.raw(); !ok {
		return false
	}
	return t.UnmarshalJSON(d.data[start:d.pos]) == nil
}

func (d *decoder) gpu(g *GPU) bool {
	return d.object(12, func(key []byte) bool {
		switch string(key) {
		case "index":
			return d.int(&g.Index)
		case "uuid":
			return d.str(&g.UUID)
		case "name":
			return d.str(&g.Name)
		case "memory_bytes":
			return d.uint(&g.MemoryBytes, 64)
		case "pci_bus_id":
			return d.str(&g.PCIBusID)
		case "healthy":
			return d.bool(&g.Healthy)
		case "unhealthy_reason":
			return d.str(&g.UnhealthyReason)
		case "numa_node":
			g.NUMANode = new(int)
			return d.int(g.NUMANode)
		case "mig_enabled":
			return d.bool(&g.MIGEnabled)
		case "nvlink_peers":
			g.NVLinkPeers = []int{}
			return d.array(func() bool {
				var p int
				ok := d.int(&p)
				g.NVLinkPeers = append(g.NVLinkPeers, p)
				return ok
			})
		case "fabric":
			g.Fabric = &Fabric{}
			return d.object(2, func(k []byte) bool {
				switch string(k) {
				case "cluster_uuid":
					return d.str(&g.Fabric.ClusterUUID)
				case "clique_id":
					return d.uint32(&g.Fabric.CliqueID)
				}
				return false
			})
		case "processes":
			g.Processes = []Process{}
			return d.array(func() bool {
				g.Processes = append(g.Processes, Process{})
				return d.process(&g.Processes[len(g.Processes)-1])
			})
		}
		return false
	})
}

func (d *decoder) process(p *Process) bool {
	return d.object(3, func(key []byte) bool {
		switch string(key) {
		case "pid":
			return d.uint32(&p.PID)
		case "used_memory_bytes":
			return d.uint(&p.UsedMemoryBytes, 64)
		case "name":
			return d.str(&p.Name)
		}
		return false
	})
}
