package service

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// DefaultStoreTimeout bounds one call of the loop to JetStream (a
// read, a publish, a KV history), as the client bounds each of its
// requests by default; calls that move many messages (a plan's
// assignments, a snapshot, reading every node's assignment) get
// storePerItem more for each. A call that runs past it fails, is
// logged and retried: no call can hold the loop for ever (a KV
// history, a consumer's read, are bounded by nothing else).
const DefaultStoreTimeout = 5 * time.Second

// storePerItem is what a bulk call gets beyond StoreTimeout per message
// or node (100,000 nodes: 200 s more).
const storePerItem = 2 * time.Millisecond

// pulse is the loop's heartbeat, which the leaser reads before each
// renewal: while the loop works on something (busy) it must make
// progress (a beat: a store call begun or ended, a plan published)
// at least every stall, or be inside an operation whose deadline (plus
// stall) has not passed. A loop stuck longer than that (a call that
// ignores its deadline, a deadlock) stops the lease's renewal, so that
// a standby takes over within the lease's TTL. An idle loop (waiting
// for events) is never stuck.
type pulse struct {
	// mu is innermost: nothing is locked while it is held.
	mu    sync.Mutex
	now   func() time.Time
	busy  bool
	doing string
	last  time.Time
	// ops are the operations in progress, innermost last: what and
	// until when it may take.
	ops []pulseOp
}

type pulseOp struct {
	what  string
	until time.Time
}

func newPulse(now func() time.Time) *pulse {
	if now == nil {
		now = time.Now
	}
	return &pulse{now: now, last: now()}
}

// work notes that the loop took up an event (what).
func (pl *pulse) work(what string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.busy, pl.doing, pl.last, pl.ops = true, what, pl.now(), pl.ops[:0]
}

// idle notes that the loop waits for events.
func (pl *pulse) idle() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.busy, pl.doing, pl.ops = false, "", pl.ops[:0]
}

// beat notes progress.
func (pl *pulse) beat() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.last = pl.now()
}

// enter notes an operation that may take until deadline; the returned
// func ends it.
func (pl *pulse) enter(what string, deadline time.Time) func() {
	pl.mu.Lock()
	pl.last = pl.now()
	pl.ops = append(pl.ops, pulseOp{what, deadline})
	n := len(pl.ops)
	pl.mu.Unlock()
	return func() {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		pl.last = pl.now()
		if len(pl.ops) >= n {
			pl.ops = slices.Delete(pl.ops, n-1, len(pl.ops))
		}
	}
}

// stuck says, when the loop is stuck by stall's measure, for how long
// it has made no progress and in what.
func (pl *pulse) stuck(stall time.Duration) (time.Duration, string, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if !pl.busy {
		return 0, "", false
	}
	now, until, what := pl.now(), pl.last.Add(stall), pl.doing
	if n := len(pl.ops); n > 0 {
		what = pl.doing + ": " + pl.ops[n-1].what
		if u := pl.ops[n-1].until.Add(stall); u.After(until) {
			until = u
		}
	}
	if !now.After(until) {
		return 0, "", false
	}
	return now.Sub(pl.last), what, true
}

// beat notes that the loop made progress.
func (p *Service) beat() { p.pulse.beat() }

// storeTimeout is the deadline of a call that moves items messages.
func (p *Service) storeTimeout(items int) time.Duration {
	return p.cfg.StoreTimeout + time.Duration(items)*storePerItem
}

// readTimeout is the deadline of reading the latest revisions of
// states' plans: a revision is read whole, snapshot and chain, so it
// scales with the plan's workers as well as the nodes: those its latest
// revision known here places, or, where none is known yet, those its
// spec asks for, as many as the inventory could hold
// (planner.MaxNodeWorkers a node).
func (p *loopState) readTimeout(states ...*planState) time.Duration {
	return p.storeTimeout(p.nodes() + p.workersOf(states...)/8)
}

// workersOf is how many workers states' plans may hold, as readTimeout
// counts them.
func (p *loopState) workersOf(states ...*planState) int {
	could := max(p.nodes(), 1) * planner.MaxNodeWorkers
	n := 0
	for _, s := range states {
		w := 0
		if s.latest != nil {
			w = s.latest.Plan.Workers.Len()
		}
		if s.spec != nil {
			w = max(w, min(s.spec.AskedWorkers(), could))
		}
		n += w
	}
	return n
}

// op bounds one call of the loop to the store (or a stretch of
// planning) by a deadline of timeout, noted in the loop's pulse; done
// ends it. cfg.storeHook, in tests, stands in for a store that hangs.
func (p *Service) op(ctx context.Context, what string, timeout time.Duration) (context.Context, func()) {
	t := p
	ctx, cancel := context.WithTimeout(ctx, timeout)
	deadline, _ := ctx.Deadline()
	end := t.pulse.enter(what, deadline)
	if h := t.cfg.storeHook; h != nil {
		h(ctx, what)
	}
	return ctx, func() { cancel(); end() }
}

// allow notes a stretch of work (planning, applying a whole inventory)
// that may take up to d, as op notes a store call; done ends it.
func (p *Service) allow(what string, d time.Duration) (done func()) {
	return p.pulse.enter(what, p.pulse.now().Add(d))
}

// stall is how long the loop may go without progress (outside an
// operation's deadline) before the lease is left to lapse: StallAfter,
// by default half the lease's TTL, at least a second.
func (p *Service) stall() time.Duration {
	if p.cfg.StallAfter > 0 {
		return p.cfg.StallAfter
	}
	return max(p.cfg.LeaseTTL/2, time.Second)
}

// Health is what a planner says of itself beyond its plans: whether it
// leads, whether it stood down after failing to write and until when it
// will not lead, whether its loop is stuck, and the problems it sees
// (a spec it cannot read, writes failing). The leader's problems also
// travel in its lease (bus.Lease.Problems), which planner status shows.
type Health struct {
	Leading bool `json:"leading"`
	// Phase is where the planner's loop stands: syncing, standing by,
	// settling, backing off or leading.
	Phase string `json:"phase"`
	// StoodDown says why this planner gave the lease up itself (its
	// writes failed persistently); Until, when it will try to lead
	// again.
	StoodDown      string    `json:"stood_down,omitempty"`
	StoodDownUntil time.Time `json:"stood_down_until,omitzero"`
	// Failures is how many replans failed in a row.
	Failures int `json:"failures"`
	// Stuck says what the loop has been stuck in, when it is.
	Stuck    string   `json:"stuck,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// loopHealth is the loop's health as the loop records it, its
// goroutine alone writing it, and each snapshot carries it: where the
// loop stands, the replans failed in a row, the stand-down and the
// problems by key. problems is copied on write: a snapshot shares it.
type loopHealth struct {
	phase          phase
	failures       int
	stoodDown      string
	stoodDownUntil time.Time
	problems       map[string]string
}

// problemNote is a problem of key (msg; "": none any more) that a
// goroutine beside the loop's (the leaser's, the drain watch's) tells
// the loop, which records it.
type problemNote struct{ key, msg string }

// stuckKey is the problem of the loop stuck: the leaser tells the loop
// (leaser.stuck), and Health says it from the pulse meanwhile, as a
// stuck loop publishes nothing.
const stuckKey = "stuck"

// stuckWhy says that the loop has made no progress for d, in what.
func stuckWhy(d time.Duration, what string) string {
	return fmt.Sprintf("the planner's loop has made no progress for %s (%s)", d.Round(time.Millisecond), what)
}

// Health reports the planner's health: the loop's, as its snapshot
// has it, and the lease and the pulse as they are now.
func (p *Service) Health() Health {
	hl := p.view().health
	h := Health{Leading: p.leads(), Phase: hl.phase.String(), StoodDown: hl.stoodDown, StoodDownUntil: hl.stoodDownUntil,
		Failures: hl.failures}
	problems := hl.problems
	if d, what, ok := p.pulse.stuck(p.stall()); ok {
		h.Stuck = what + " for " + d.Round(time.Millisecond).String()
		problems = maps.Clone(problems)
		if problems == nil {
			problems = map[string]string{}
		}
		problems[stuckKey] = stuckWhy(d, what)
	}
	h.Problems = sortedProblems(problems, "")
	return h
}

// sortedProblems are problems' messages by key, but for skip's.
func sortedProblems(problems map[string]string, skip string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(problems)) {
		if k != skip {
			out = append(out, problems[k])
		}
	}
	return out
}

// problem records (msg not empty) or clears a problem of key.
func (p *loopState) problem(key, msg string) {
	if cur, ok := p.health.problems[key]; cur == msg && (ok || msg == "") {
		return
	}
	problems := maps.Clone(p.health.problems)
	if msg == "" {
		delete(problems, key)
	} else {
		if problems == nil {
			problems = map[string]string{}
		}
		problems[key] = msg
	}
	p.health.problems = problems
}

// stoodDownFor records a stand-down (why, until when), or its end ("").
func (p *loopState) stoodDownFor(why string, until time.Time) {
	p.health.stoodDown, p.health.stoodDownUntil = why, until
	if why == "" {
		p.problem("stood-down", "")
		return
	}
	p.problem("stood-down", "stood down: "+why)
}

// nodes is the live inventory's size, which bulk calls' deadlines
// scale with.
func (p *loopState) nodes() int {
	return len(p.live.docs)
}
