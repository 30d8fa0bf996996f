package client

import (
	"bytes"
	"encoding/json"

	"github.com/poolplanner/poolplanner/internal/jsonscan"
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
	d := assignmentDecoder{Scanner: jsonscan.Scanner{Data: data}}
	if d.assignment(&fresh) && d.End() {
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
	jsonscan.Scanner
	// seen are the first strings read (n of them), for the next equal
	// one to share: an assignment has a handful of distinct short strings
	// but its GPU UUIDs and device lists, so a short list searched in turn
	// does.
	seen [seenMax]string
	n    int
}

// seenMax bounds seen, so that a body of many distinct strings costs a
// bounded search per string.
const seenMax = 32

// str reads a string, shared with an equal one read before.
func (d *assignmentDecoder) str(out *string) bool {
	s, ok := d.Raw()
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

func (d *assignmentDecoder) assignment(a *Assignment) bool {
	return d.Object(4, func(key []byte) bool {
		switch string(key) {
		case "plan":
			return d.str(&a.Plan)
		case "revision":
			return d.Int(&a.Revision)
		case "node_id":
			return d.str(&a.NodeID)
		case "workers":
			if d.Null() {
				return true // nil, as encoding/json leaves it
			}
			// Each worker has one device list: its count sizes them.
			a.Workers = make([]PlacedWorker, 0, bytes.Count(d.Data[d.Pos:], []byte(`"cuda_visible_devices"`)))
			return d.Array(func() bool {
				a.Workers = append(a.Workers, PlacedWorker{})
				return d.worker(&a.Workers[len(a.Workers)-1])
			})
		}
		return false
	})
}

func (d *assignmentDecoder) worker(w *PlacedWorker) bool {
	return d.Object(12, func(key []byte) bool {
		switch string(key) {
		case "component":
			var s string
			ok := d.str(&s)
			w.Component = plan.Component(s)
			return ok
		case "index":
			return d.Int(&w.Index)
		case "pool":
			return d.str(&w.Pool)
		case "node_id":
			return d.str(&w.NodeID)
		case "ip":
			return d.str(&w.IP)
		case "gpus":
			if d.Null() {
				return true
			}
			w.GPUs = make([]int, 0, d.Elems())
			return d.Array(func() bool {
				w.GPUs = append(w.GPUs, 0)
				return d.Int(&w.GPUs[len(w.GPUs)-1])
			})
		case "gpu_uuids":
			if d.Null() {
				return true
			}
			w.GPUUUIDs = make([]string, 0, d.Elems())
			return d.Array(func() bool {
				w.GPUUUIDs = append(w.GPUUUIDs, "")
				return d.str(&w.GPUUUIDs[len(w.GPUUUIDs)-1])
			})
		case "gpu_share":
			return d.Float(&w.GPUShare)
		case "cpus":
			return d.Float(&w.CPUs)
		case "cuda_visible_devices":
			return d.str(&w.CUDAVisibleDevices)
		case "plan":
			return d.str(&w.Plan)
		case "revision":
			return d.Int(&w.Revision)
		}
		return false
	})
}
