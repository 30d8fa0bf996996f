package plan

import (
	"encoding/json"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends the plan document as JSON, the same document
// encoding/json writes for a Plan but written directly: plans of thousands
// of workers are published on every change, and reflection made encoding
// the largest part of a replan.
func (p *Document) AppendJSON(b []byte) []byte {
	// About 200 bytes a worker: grow once, not twenty times.
	b = slices.Grow(b, 4096+200*p.Workers.Len()+100*len(p.Pools)*8)
	b = p.appendHead(b)
	b = p.Workers.appendJSON(b, nil)
	return append(p.Placement.appendTail(b), '}')
}

// WriteJSON writes what AppendJSON appends to w, a megabyte at a time:
// a plan of 400,000 workers is 100 MB of JSON, which need not be in
// memory at once.
func (p *Document) WriteJSON(w io.Writer) error {
	const chunk = 1 << 20
	var werr error
	flush := func(b []byte) []byte {
		if werr == nil {
			_, werr = w.Write(b)
		}
		return b[:0]
	}
	b := p.appendHead(make([]byte, 0, 2*chunk))
	b = p.Workers.appendJSON(b, func(b []byte) []byte {
		if len(b) < chunk {
			return b
		}
		return flush(b)
	})
	flush(append(p.Placement.appendTail(b), '}'))
	return werr
}

// appendHead writes the document up to its workers: the header, the
// export and the pools, and the workers' key.
func (p *Document) appendHead(b []byte) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, p.Name)
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, int64(p.Revision), 10)
	b = append(b, `,"created_at":"`...)
	b = p.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","reason":`...)
	b = appendString(b, p.Reason)
	b = append(b, `,"mode":`...)
	b = appendString(b, p.Mode)
	b = append(b, `,"strategy":`...)
	b = appendString(b, p.Strategy)
	b = append(b, `,"env_strategy":`...)
	b = appendString(b, p.EnvStrategy)
	b = append(b, `,"valid":`...)
	b = strconv.AppendBool(b, p.Valid())
	b = append(b, `,"error":`...)
	b = appendString(b, p.Error)
	b = p.Header.appendState(b)
	b = p.Header.appendWhy(b)
	b = p.Placement.appendHead(b)
	return append(b, `,"workers":`...)
}

// appendList writes items as a JSON list (null for nil), each by f.
func appendList[T any](b []byte, items []T, f func([]byte, T) []byte) []byte {
	if items == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = f(b, x)
	}
	return append(b, ']')
}

// appendHead writes the export and the pools, each after a comma.
func (p *Placement) appendHead(b []byte) []byte {
	b = append(b, `,"resource_pool":`...)
	b = appendList(b, p.ResourcePool, func(b []byte, e PoolExport) []byte {
		js, _ := e.MarshalJSON()
		return append(b, js...)
	})
	b = append(b, `,"pools":`...)
	return appendList(b, p.Pools, appendPool)
}

// appendTail writes what follows the workers: the buffers' map and the
// notes, each after a comma.
func (p *Placement) appendTail(b []byte) []byte {
	b = append(b, `,"storage_to_train_workers":`...)
	if p.StorageToTrainWorkers == nil {
		b = append(b, "null"...)
	} else {
		keys := slices.Sorted(maps.Keys(p.StorageToTrainWorkers))
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendInts(b, p.StorageToTrainWorkers[k])
		}
		b = append(b, '}')
	}
	if len(p.Notes) > 0 {
		b = append(b, `,"notes":`...)
		b = appendList(b, p.Notes, func(b []byte, n Note) []byte {
			b = append(b, `{"node_id":`...)
			b = appendString(b, n.NodeID)
			if n.Component != "" {
				b = append(b, `,"component":`...)
				b = appendString(b, string(n.Component))
			}
			b = append(b, `,"reason":`...)
			b = appendString(b, n.Reason)
			return append(b, '}')
		})
	}
	return b
}

// appendState writes the state, the unplaced workers and the pending
// spec, each after a comma.
func (p *Header) appendState(b []byte) []byte {
	b = append(b, `,"state":`...)
	b = appendString(b, string(p.PlanState()))
	if len(p.Unplaced) > 0 {
		b = append(b, `,"unplaced":`...)
		b = appendList(b, p.Unplaced, func(b []byte, u Unplaced) []byte {
			b = append(b, `{"component":`...)
			b = appendString(b, string(u.Component))
			b = append(b, `,"index":`...)
			b = strconv.AppendInt(b, int64(u.Index), 10)
			b = append(b, `,"reason":`...)
			b = appendString(b, u.Reason)
			if u.Pool != "" {
				b = append(b, `,"pool":`...)
				b = appendString(b, u.Pool)
			}
			if u.NodeID != "" {
				b = append(b, `,"node_id":`...)
				b = appendString(b, u.NodeID)
			}
			if len(u.GPUs) > 0 {
				b = append(b, `,"gpus":`...)
				b = appendInts(b, u.GPUs)
			}
			if len(u.GPUUUIDs) > 0 {
				b = append(b, `,"gpu_uuids":`...)
				b = appendList(b, u.GPUUUIDs, appendString)
			}
			return append(b, '}')
		})
	}
	if p.PendingSpec != nil {
		b = append(b, `,"pending_spec":{"reason":`...)
		b = appendString(b, p.PendingSpec.Reason)
		b = append(b, '}')
	}
	return b
}

// appendWhy writes moved, the warnings, demands, capacity and
// explanations, each after a comma.
func (p *Header) appendWhy(b []byte) []byte {
	b = append(b, `,"moved":`...)
	b = strconv.AppendInt(b, int64(p.Moved), 10)
	if len(p.Warnings) > 0 {
		b = append(b, `,"warnings":`...)
		b = appendList(b, p.Warnings, appendString)
	}
	b = append(b, `,"demands":`...)
	b = appendDemands(b, p.Demands)
	b = append(b, `,"capacity":{"gpus_required":`...)
	b = appendFloat(b, p.Capacity.GPUsRequired)
	b = append(b, `,"gpus_available":`...)
	b = strconv.AppendInt(b, int64(p.Capacity.GPUsAvailable), 10)
	b = append(b, `,"cpus_required":`...)
	b = appendFloat(b, p.Capacity.CPUsRequired)
	b = append(b, `,"cpus_available":`...)
	b = appendFloat(b, p.Capacity.CPUsAvailable)
	b = append(b, '}')
	if len(p.Explanations) > 0 {
		b = append(b, `,"explanations":`...)
		b = appendExplanations(b, p.Explanations)
	}
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(p.Priority), 10)
	b = append(b, `,"gpus_held":`...)
	b = strconv.AppendInt(b, int64(p.GPUsHeld), 10)
	if len(p.PreemptedBy) > 0 {
		b = append(b, `,"preempted_by":`...)
		b = appendList(b, p.PreemptedBy, appendString)
	}
	if p.Removed() {
		b = append(b, `,"removed":true`...)
	}
	st := &p.Status
	b = append(b, `,"status":{"state":`...)
	b = appendString(b, string(p.PlanState()))
	if st.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, string(st.Reason))
	}
	if len(st.By) > 0 {
		b = append(b, `,"by":`...)
		b = appendList(b, st.By, appendString)
	}
	if st.Cause != "" {
		b = append(b, `,"cause":`...)
		b = appendString(b, st.Cause)
	}
	if st.Fresh != "" {
		b = append(b, `,"fresh":`...)
		b = appendString(b, st.Fresh)
	}
	// Resizes and drains are rare and small: encoding/json writes them.
	b = appendMarshaled(b, "resized", st.Resized)
	b = appendMarshaled(b, "drained", st.Drained)
	b = appendMarshaled(b, "leaving", st.Leaving)
	return append(b, '}')
}

// appendMarshaled writes ,"key":xs as encoding/json does, if xs has any.
func appendMarshaled[T any](b []byte, key string, xs []T) []byte {
	if len(xs) == 0 {
		return b
	}
	js, err := json.Marshal(xs)
	if err != nil {
		return b
	}
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	return append(b, js...)
}

func appendDemands(b []byte, ds []Demand) []byte {
	return appendList(b, ds, func(b []byte, d Demand) []byte {
		b = append(b, `{"component":`...)
		b = appendString(b, string(d.Component))
		b = append(b, `,"workers":`...)
		b = strconv.AppendInt(b, int64(d.Workers), 10)
		if d.Auto {
			b = append(b, `,"auto":true`...)
		}
		b = append(b, `,"num_gpus":`...)
		b = appendFloat(b, d.NumGPUs)
		b = append(b, `,"num_cpus":`...)
		b = appendFloat(b, d.NumCPUs)
		return append(b, '}')
	})
}

// appendExplanations is rare and small: encoding/json writes it.
func appendExplanations(b []byte, xs []Explanation) []byte {
	js, err := json.Marshal(xs)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, js...)
}

func appendPool(b []byte, pl Pool) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, pl.Name)
	b = append(b, `,"nodes":`...)
	b = pl.Nodes.appendJSON(b)
	return append(b, '}')
}

func appendPoolNode(b []byte, n PoolNode) []byte {
	b = append(b, `{"node_id":`...)
	b = appendString(b, n.NodeID)
	b = append(b, `,"ip":`...)
	b = appendString(b, n.IP)
	b = append(b, `,"total_gpus":`...)
	b = strconv.AppendInt(b, int64(n.TotalGPUs), 10)
	b = append(b, `,"total_cpus":`...)
	b = appendFloat(b, n.TotalCPUs)
	b = append(b, `,"allocations":`...)
	if n.Allocations == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		// encoding/json sorts map keys; so do we.
		for i, c := range slices.Sorted(maps.Keys(n.Allocations)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, string(c))
			b = append(b, ':')
			b = appendList(b, n.Allocations[c], func(b []byte, r Range) []byte {
				b = append(b, '[')
				b = strconv.AppendInt(b, int64(r.First), 10)
				b = append(b, ',')
				b = strconv.AppendInt(b, int64(r.Last), 10)
				return append(b, ']')
			})
		}
		b = append(b, '}')
	}
	if len(n.UnhealthyGPUs) > 0 {
		b = append(b, `,"unhealthy_gpus":`...)
		b = appendInts(b, n.UnhealthyGPUs)
	}
	b = append(b, `,"worker_counts":{`...)
	first := true
	for _, c := range GPUComponents {
		if counts := *n.WorkerCounts.Of(c); len(counts) > 0 {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendString(b, string(c))
			b = append(b, ':')
			b = appendInts(b, counts)
		}
	}
	b = append(b, '}')
	if n.GPUModel != "" {
		b = append(b, `,"gpu_model":`...)
		b = appendString(b, n.GPUModel)
	}
	if n.NVLinkDomain != "" {
		b = append(b, `,"nvlink_domain":`...)
		b = appendString(b, n.NVLinkDomain)
	}
	return append(b, '}')
}

// AppendJSON appends the worker as JSON, as encoding/json writes it.
func (w *Worker) AppendJSON(b []byte) []byte { return w.appendJSON(b) }

func (w *Worker) appendJSON(b []byte) []byte {
	b = append(b, `{"component":`...)
	b = appendString(b, string(w.Component))
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(w.Index), 10)
	b = append(b, `,"pool":`...)
	b = appendString(b, w.Pool)
	b = append(b, `,"node_id":`...)
	b = appendString(b, w.NodeID)
	b = append(b, `,"ip":`...)
	b = appendString(b, w.IP)
	b = append(b, `,"gpus":`...)
	b = appendInts(b, w.GPUs)
	b = append(b, `,"gpu_uuids":`...)
	if w.GPUUUIDs == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, u := range w.GPUUUIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, u)
		}
		b = append(b, ']')
	}
	b = append(b, `,"gpu_share":`...)
	b = appendFloat(b, w.GPUShare)
	b = append(b, `,"cpus":`...)
	b = appendFloat(b, w.CPUs)
	return append(b, '}')
}

func appendInts(b []byte, xs []int) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendFloat writes a float as encoding/json does for ordinary values,
// and null for what JSON cannot hold (the planner bounds its inputs so
// that none arises; a document must stay JSON whatever happens).
func appendFloat(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...)
	}
	if a := abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		return strconv.AppendFloat(b, f, 'e', -1, 64)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// AppendString appends s as a JSON string.
func AppendString(b []byte, s string) []byte { return appendString(b, s) }

// appendString writes s as a JSON string, escaping what JSON requires.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
