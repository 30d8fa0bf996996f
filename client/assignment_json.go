package client

import (
	"encoding/json"
	"math"
	"strconv"
)

// JSON is the assignment as json.Marshal writes it, byte for byte (and
// its error), without reflection where it can: a planner's first
// revision publishes one per node (20,000 at 20,000 nodes), and
// reflection took most of a second of it. It writes plain assignments
// itself (strings of printable ASCII but <, > and &, which Marshal
// escapes; finite numbers Marshal writes without an exponent) and hands
// any other to json.Marshal.
func (a *Assignment) JSON() ([]byte, error) {
	if !a.plain() {
		return json.Marshal(a)
	}
	return a.appendJSON(nil), nil
}

// AppendJSON is JSON appended to b (b's bytes reused where its room
// holds it): a publisher that sends thousands reuses the buffers of
// those acknowledged rather than making garbage of each.
func (a *Assignment) AppendJSON(b []byte) ([]byte, error) {
	if !a.plain() {
		raw, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		return append(b, raw...), nil
	}
	if b == nil {
		return a.appendJSON(nil), nil
	}
	return a.appendJSON(b), nil
}

// appendJSON appends a plain assignment.
func (a *Assignment) appendJSON(b []byte) []byte {
	if b == nil {
		b = make([]byte, 0, 64+320*len(a.Workers))
	}
	b = append(b, `{"plan":`...)
	b = appendPlain(b, a.Plan)
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, int64(a.Revision), 10)
	b = append(b, `,"node_id":`...)
	b = appendPlain(b, a.NodeID)
	b = append(b, `,"workers":`...)
	if a.Workers == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range a.Workers {
			if i > 0 {
				b = append(b, ',')
			}
			// A plain worker's fields need no escaping, so the
			// worker's own writer (lookups') writes them as Marshal.
			b = a.Workers[i].AppendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// plain says whether every string and number of a is one the hand-made
// writers (this, plan.Worker's, PlacedWorker's) write as Marshal does.
func (a *Assignment) plain() bool {
	if !plainString(a.Plan) || !plainString(a.NodeID) {
		return false
	}
	for i := range a.Workers {
		w := &a.Workers[i]
		if !plainString(string(w.Component)) || !plainString(w.Pool) || !plainString(w.NodeID) || !plainString(w.IP) ||
			!plainString(w.CUDAVisibleDevices) || !plainString(w.Plan) || !plainFloat(w.GPUShare) || !plainFloat(w.CPUs) {
			return false
		}
		for _, u := range w.GPUUUIDs {
			if !plainString(u) {
				return false
			}
		}
	}
	return true
}

func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainBytes[s[i]] {
			return false
		}
	}
	return true
}

// plainBytes are the bytes Marshal writes as they are in a string:
// printable ASCII but the quote, the backslash and HTML's <, > and &.
// Read only.
var plainBytes = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// plainFloat: Marshal writes f in 'f' format (finite, zero or of
// magnitude in [1e-6, 1e21)).
func plainFloat(f float64) bool {
	a := math.Abs(f)
	return !math.IsNaN(f) && !math.IsInf(f, 0) && (a == 0 || a >= 1e-6 && a < 1e21)
}

// appendPlain appends a plain string (plainString) quoted.
func appendPlain(b []byte, s string) []byte {
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
