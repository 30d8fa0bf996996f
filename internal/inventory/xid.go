package inventory

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// XIDAction is what NVIDIA's XID catalog says resolves an XID (its
// resolution column), and so how long the GPU stays unhealthy.
type XIDAction int

const (
	// XIDIgnore: the application's own fault (restart it); the GPU is
	// fine and stays healthy.
	XIDIgnore XIDAction = iota
	// XIDReset: resolved by restarting the application or resetting
	// the GPU: unhealthy until NVML reports the GPU clean again (it
	// answers, no row remapping or page retirement pending).
	XIDReset
	// XIDOperator: needs a reboot, or an operator (field diagnostics,
	// RMA): unhealthy until the reporter restarts.
	XIDOperator
)

func (a XIDAction) String() string {
	switch a {
	case XIDIgnore:
		return "ignore"
	case XIDReset:
		return "reset"
	}
	return "operator"
}

// xidCatalog is the resolution of the XIDs NVIDIA's catalog lists for
// data-centre GPUs. An XID it lacks needs an operator: a GPU is not
// trusted again on a guess.
var xidCatalog = map[uint64]XIDAction{
	// Application faults (the device plugin's skip list).
	13: XIDIgnore, 31: XIDIgnore, 43: XIDIgnore, 45: XIDIgnore, 68: XIDIgnore, 109: XIDIgnore,
	// Restart the application, or reset the GPU.
	48:  XIDReset, // double-bit ECC error: row remapped at the next reset
	61:  XIDReset, // internal micro-controller breakpoint
	62:  XIDReset, // internal micro-controller halt
	63:  XIDReset, // ECC page retirement / row remapping recorded
	69:  XIDReset, // graphics engine class error
	74:  XIDReset, // NVLink error
	92:  XIDReset, // high single-bit ECC error rate
	94:  XIDReset, // contained ECC error
	95:  XIDReset, // uncontained ECC error
	119: XIDReset, // GSP RPC timeout
	120: XIDReset, // GSP error
	140: XIDReset, // unrecovered ECC error
	// Reboot the node, or an operator.
	64: XIDOperator, // row remapping / page retirement failure
	79: XIDOperator, // GPU has fallen off the bus
	// NVLink and fabric faults needing the node down.
	144: XIDOperator, 145: XIDOperator, 146: XIDOperator, 147: XIDOperator, 148: XIDOperator,
	149: XIDOperator, 150: XIDOperator, 151: XIDOperator, 152: XIDOperator, 153: XIDOperator,
}

// healthMark is why a GPU is unhealthy, and whether a check may clear it.
type healthMark struct {
	reason      string
	recoverable bool
	at          time.Time
}

// resolution words an XID's action for a GPU's unhealthy_reason.
func resolution(a XIDAction) string {
	if a == XIDReset {
		return "until a reset or restart clears it"
	}
	return "needs a reboot or an operator"
}

// ClassifyXID is what resolves XID code, by NVIDIA's catalog.
func ClassifyXID(code uint64) XIDAction {
	if a, ok := xidCatalog[code]; ok {
		return a
	}
	return XIDOperator
}

// xidAction is ClassifyXID with an ignore list in force: a listed XID is
// ignored; one the list leaves out that the catalog calls the
// application's is taken as resolved by a reset (the list replaces the
// catalog's own application faults).
func xidAction(code uint64, ignored map[uint64]bool) XIDAction {
	if ignored != nil {
		if ignored[code] {
			return XIDIgnore
		}
		if a := ClassifyXID(code); a != XIDIgnore {
			return a
		}
		return XIDReset
	}
	return ClassifyXID(code)
}

// DefaultHealthEvery is how often a GPU marked unhealthy by an XID that
// a reset resolves is checked again.
const DefaultHealthEvery = 30 * time.Second

// XIDInjection is a simulated XID: on GPU, CODE, After the source
// starts (reporter --simulate 8xH100 --xid GPU:CODE[@DELAY]).
type XIDInjection struct {
	GPU   int
	Code  uint64
	After time.Duration
}

// ParseXIDInjection reads GPU:CODE[@DELAY] for a node of count GPUs.
func ParseXIDInjection(s string, count int) (XIDInjection, error) {
	spec, delay, hasDelay := strings.Cut(s, "@")
	gpu, code, ok := strings.Cut(spec, ":")
	if !ok {
		return XIDInjection{}, fmt.Errorf("--xid %q: want GPU:CODE or GPU:CODE@DELAY, as in 3:94 or 3:94@30s", s)
	}
	var x XIDInjection
	var err error
	if x.GPU, err = strconv.Atoi(gpu); err != nil || x.GPU < 0 || x.GPU >= count {
		return XIDInjection{}, fmt.Errorf("--xid %q: GPU %q; the node has GPUs 0 to %d", s, gpu, count-1)
	}
	if x.Code, err = strconv.ParseUint(code, 10, 32); err != nil || x.Code == 0 {
		return XIDInjection{}, fmt.Errorf("--xid %q: XID %q; want a number from 1, as in 94", s, code)
	}
	if hasDelay {
		if x.After, err = time.ParseDuration(delay); err != nil || x.After < 0 {
			return XIDInjection{}, fmt.Errorf("--xid %q: delay %q; want a duration such as 30s", s, delay)
		}
	}
	return x, nil
}
