package client

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/poolplanner/poolplanner/plan"
)

// decodeAssignment reads an assignment body into a as json.Unmarshal
// does into a zero Assignment (a's Seq and Err, which JSON does not
// carry, kept), value and error alike, without reflection: a planner
// restarting at 20,000 nodes reads every node's assignment to reconcile
// them, and encoding/json allocated some 200 MB doing so, most of the
// planner's peak. It reads the bodies planners write (known fields
// spelled as they are, once each, strings without escapes, integers as
// integers, null only for a list) itself, and hands anything else to encoding/json,
// so that every error, and every value an odd body gives, is
// encoding/json's. The strings an assignment repeats (its plan, node,
// IP, pools, components, a shared GPU's UUID) are one string each.
func decodeAssignment(data []byte, a *Assignment) error {
	fresh := Assignment{Seq: a.Seq, Err: a.Err}
	d := assignmentDecoder{data: data}
	if d.assignment(&fresh) && d.end() {
		*a = fresh
		return nil
	}
	fresh = Assignment{Seq: a.Seq, Err: a.Err}
	err := json.Unmarshal(data, &fresh)
	*a = fresh
	return err
}

// assignmentDecoder is decodeAssignment's fast path: each method reads
// one value at pos and says whether it could (false: leave the body to
// encoding/json). Used by one goroutine, for one body.
type assignmentDecoder struct {
	data []byte
	pos  int
	// seen are the first strings read (n of them), for the next equal
	// one to share: an assignment has a handful of distinct short strings
	// but its GPU UUIDs and device lists, so a short list searched in turn
	// does.
	seen [seenMax]string
	n    int
}

func (d *assignmentDecoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// end: nothing but space after the body.
func (d *assignmentDecoder) end() bool {
	d.space()
	return d.pos == len(d.data)
}

// byte reads c, after space.
func (d *assignmentDecoder) byte(c byte) bool {
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

// raw reads a string without escapes or control characters, valid
// UTF-8, and returns its contents (quotes excluded).
func (d *assignmentDecoder) raw() ([]byte, bool) {
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

// seenMax bounds seen, so that a body of many distinct strings costs a
// bounded search per string.
const seenMax = 32

// str reads a string, shared with an equal one read before.
func (d *assignmentDecoder) str(out *string) bool {
	s, ok := d.raw()
	if !ok {
		return false
	}
	for _, t := range d.seen[:d.n] {
		if t == string(s) {
			*out = t
			return true
		}
	}
	*out = string(s)
	if d.n < seenMax {
		d.seen[d.n] = *out
		d.n++
	}
	return true
}

// number reads a number literal as JSON's grammar has it; integer says
// it had neither fraction nor exponent.
func (d *assignmentDecoder) number() (lit []byte, integer, ok bool) {
	d.space()
	start := d.pos
	digits := func() int {
		n := 0
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	if d.pos < len(d.data) && d.data[d.pos] == '-' {
		d.pos++
	}
	first := d.pos
	n := digits()
	if n == 0 || n > 1 && d.data[first] == '0' {
		return nil, false, false
	}
	integer = true
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	return d.data[start:d.pos], integer, true
}

// int reads an integer as encoding/json reads one into an int: no
// fraction or exponent, in range.
func (d *assignmentDecoder) int(out *int) bool {
	lit, integer, ok := d.number()
	if !ok || !integer {
		return false
	}
	n, err := strconv.ParseInt(string(lit), 10, strconv.IntSize)
	*out = int(n)
	return err == nil
}

// float reads a number as encoding/json reads one into a float64.
func (d *assignmentDecoder) float(out *float64) bool {
	lit, _, ok := d.number()
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	*out = f
	return err == nil
}

// object reads an object of a struct with at most fields keys, calling
// field with each key (the value is field's to read). A key seen twice
// is left to encoding/json, which merges such values in ways not worth
// copying.
func (d *assignmentDecoder) object(fields int, field func(key []byte) bool) bool {
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

// null reads null.
func (d *assignmentDecoder) null() bool {
	d.space()
	if len(d.data)-d.pos >= 4 && string(d.data[d.pos:d.pos+4]) == "null" {
		d.pos += 4
		return true
	}
	return false
}

// elems guesses how many elements the array at pos has, from its commas
// up to the first ']' (exact for numbers and plain strings): a capacity,
// so that a list is not grown through several arrays.
func (d *assignmentDecoder) elems() int {
	end := bytes.IndexByte(d.data[d.pos:], ']')
	if end < 0 {
		return 0
	}
	return bytes.Count(d.data[d.pos:d.pos+end], []byte{','}) + 1
}

// array reads an array (not null), calling elem for each element.
func (d *assignmentDecoder) array(elem func() bool) bool {
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

func (d *assignmentDecoder) assignment(a *Assignment) bool {
	return d.object(4, func(key []byte) bool {
		switch string(key) {
		case "plan":
			return d.str(&a.Plan)
		case "revision":
			return d.int(&a.Revision)
		case "node_id":
			return d.str(&a.NodeID)
		case "workers":
			if d.null() {
				return true // nil, as encoding/json leaves it
			}
			// Each worker has one device list: its count sizes them.
			a.Workers = make([]PlacedWorker, 0, bytes.Count(d.data[d.pos:], []byte(`"cuda_visible_devices"`)))
			return d.array(func() bool {
				a.Workers = append(a.Workers, PlacedWorker{})
				return d.worker(&a.Workers[len(a.Workers)-1])
			})
		}
		return false
	})
}

func (d *assignmentDecoder) worker(w *PlacedWorker) bool {
	return d.object(12, func(key []byte) bool {
		switch string(key) {
		case "component":
			var s string
			ok := d.str(&s)
			w.Component = plan.Component(s)
			return ok
		case "index":
			return d.int(&w.Index)
		case "pool":
			return d.str(&w.Pool)
		case "node_id":
			return d.str(&w.NodeID)
		case "ip":
			return d.str(&w.IP)
		case "gpus":
			if d.null() {
				return true
			}
			w.GPUs = make([]int, 0, d.elems())
			return d.array(func() bool {
				w.GPUs = append(w.GPUs, 0)
				return d.int(&w.GPUs[len(w.GPUs)-1])
			})
		case "gpu_uuids":
			if d.null() {
				return true
			}
			w.GPUUUIDs = make([]string, 0, d.elems())
			return d.array(func() bool {
				w.GPUUUIDs = append(w.GPUUUIDs, "")
				return d.str(&w.GPUUUIDs[len(w.GPUUUIDs)-1])
			})
		case "gpu_share":
			return d.float(&w.GPUShare)
		case "cpus":
			return d.float(&w.CPUs)
		case "cuda_visible_devices":
			return d.str(&w.CUDAVisibleDevices)
		case "plan":
			return d.str(&w.Plan)
		case "revision":
			return d.int(&w.Revision)
		}
		return false
	})
}
