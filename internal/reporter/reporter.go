// Package reporter keeps a node's inventory in the inventory bucket: a
// full put at start and on every change, a cheap heartbeat put in
// between, retries while NATS is away, and a delete on shutdown. It takes
// its source and store as interfaces so that the planner can run a local
// reporter in-process.
package reporter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/store"
)

// Store is where the reporter keeps the inventory; *store.InventoryStore is
// the real one. Writes name the revision they replace, so that a key
// someone else wrote meanwhile is noticed (store.ErrKeyMoved).
type Store interface {
	// PutIf stores doc under nodeID for ttl if the key is at revision
	// last. heartbeat marks a put whose bytes equal the previous put's.
	PutIf(ctx context.Context, nodeID string, doc []byte, heartbeat bool, ttl time.Duration, last uint64) (uint64, error)
	// DeleteIf removes nodeID's key if it is at revision last.
	DeleteIf(ctx context.Context, nodeID string, ttl time.Duration, last uint64) error
	// State is the key as it stands: its document (nil when deleted),
	// revision (0 when it holds nothing) and when it expires.
	State(ctx context.Context, nodeID string) (store.KeyState, error)
}

// ErrOtherReporter is Run's error when another reporter, still running,
// writes this node's key: a second reporter started for one node, or
// two hosts given one node id. Rather than overwrite each other every
// heartbeat (the planner would see one node whose GPUs keep changing),
// the reporter stops, without touching the key, and the error names the
// other's host and pid.
var ErrOtherReporter = errors.New("another reporter writes this node's key")

var _ Store = (*store.InventoryStore)(nil)

// Defaults of the reporter's timing, as the contract's flags document.
const (
	DefaultHeartbeat = 5 * time.Second
	// DefaultTTLBeats is how many heartbeats a key outlives a silent
	// reporter by.
	DefaultTTLBeats = 3
)

// Config is what Run needs.
type Config struct {
	Source    inventory.Source
	Store     Store
	Heartbeat time.Duration
	// TTL is how long the key outlives the last put; it must exceed
	// Heartbeat, or the key would flicker between puts.
	TTL time.Duration
	Log zerolog.Logger
	// Now is the clock for reported_at; nil means time.Now.
	Now func() time.Time
	// Metrics counts puts and failures (nil: none).
	Metrics *metrics.Reporter
	// PID is this reporter's process id, in every document it writes
	// (reporter_pid); 0 means os.Getpid().
	PID int
	// Alive tells whether a process of this host runs; nil means
	// ProcessAlive.
	Alive func(pid int) bool
}

// Validate checks the timing.
func (c Config) Validate() error {
	switch {
	case c.Source == nil || c.Store == nil:
		return errors.New("reporter: no source or store")
	case c.Heartbeat <= 0:
		return fmt.Errorf("heartbeat %s: must be positive", c.Heartbeat)
	case c.TTL < time.Second:
		return fmt.Errorf("ttl %s: must be at least 1s (NATS counts message TTLs in whole seconds)", c.TTL)
	case c.TTL <= c.Heartbeat:
		return fmt.Errorf("ttl %s: must be longer than the heartbeat (%s)", c.TTL, c.Heartbeat)
	}
	return nil
}

// Run reports until ctx is done, then deletes the node's key and returns
// nil. Errors from NATS or the source are logged and retried, never
// returned: a reporter outlives any outage.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PID == 0 {
		cfg.PID = os.Getpid()
	}
	if cfg.Alive == nil {
		cfg.Alive = ProcessAlive
	}
	r := &run{Config: cfg, putTimeout: min(max(cfg.Heartbeat, time.Second), 5*time.Second), instance: nuid.Next(), started: cfg.Now()}
	instances.Store(r.instance, true)
	defer instances.Delete(r.instance)
	return r.loop(ctx)
}

// instances holds the instance ids of the reporters running in this
// process (the planner runs several): a document of this process's pid
// is a live reporter's only if its instance is here, and otherwise a
// previous process's that had the same pid (a container's reporter is
// pid 1 at every start).
var instances sync.Map

type run struct {
	Config
	putTimeout time.Duration
	// instance is this process's id, in every document it writes; rev the
	// key's revision after its last write (0: not yet known, read it).
	instance string
	rev      uint64
	stop     error // set when another reporter holds the key

	last    inventory.NodeInventory
	doc     []byte // last as JSON; nil until the source first answers
	stored  bool   // doc is in the store as of the last put
	ever    bool   // some put was sent: there may be a key to delete
	fails   int    // consecutive failed puts or reads
	retry   *time.Timer
	retryCh <-chan time.Time
	// started is when the run began; published, whether a put ever
	// succeeded: failures before it, within bus.StartGrace, are a
	// cluster forming (failLevel).
	started   time.Time
	published bool
}

// failLevel is the level of a failed put or read: info while JetStream
// comes up at start, a warning once it was reached or past
// bus.StartGrace.
func (r *run) failLevel() zerolog.Level {
	if r.published {
		return zerolog.WarnLevel
	}
	return bus.StartLevel(r.Now().Sub(r.started))
}

func (r *run) loop(ctx context.Context) error {
	beat := time.NewTicker(r.Heartbeat)
	defer beat.Stop()
	for {
		if r.doc == nil || !r.stored {
			if r.doc == nil {
				r.read(ctx)
			}
			if r.doc != nil && r.put(ctx, false) {
				// The next heartbeat is a full interval after the change.
				beat.Reset(r.Heartbeat)
			}
			if r.doc == nil || !r.stored {
				r.scheduleRetry()
			}
		}
		if r.stop != nil {
			return r.stop
		}
		select {
		case <-ctx.Done():
			r.shutdown()
			return nil
		case <-beat.C:
			if r.stored {
				r.put(ctx, true)
			}
			if r.stop != nil {
				return r.stop
			}
		case <-r.Source.Changed():
			r.read(ctx)
		case <-r.retryCh:
			r.retryCh = nil
		}
	}
}

// read asks the source and, if the inventory changed, makes a new
// document to put.
func (r *run) read(ctx context.Context) {
	inv, err := r.Source.Inventory(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.Metrics.Failed("inventory")
			r.Log.Error().Err(err).Msg("reading the inventory failed; keeping the last one")
		}
		return
	}
	if r.doc != nil && inventory.SameInventory(r.last, inv) {
		return
	}
	inv.ReportedAt, inv.Reporter, inv.ReporterPID = r.Now().UTC(), r.instance, r.PID
	doc, err := json.Marshal(inv)
	if err != nil {
		r.Log.Error().Err(err).Msg("encoding the inventory failed")
		return
	}
	if r.doc != nil {
		r.Log.Info().Int("gpus", len(inv.GPUs)).Int("healthy_gpus", len(inv.HealthyGPUs())).Msg("inventory changed; reporting at once")
	}
	r.last, r.doc, r.stored = inv, doc, false
}

// put writes the document; a heartbeat put only refreshes the TTL. After
// a failure the next put is a full one, so a watcher that lost the key
// meanwhile sees a change, not a heartbeat of something it never had.
func (r *run) put(ctx context.Context, heartbeat bool) bool {
	pctx, cancel := context.WithTimeout(ctx, r.putTimeout)
	defer cancel()
	// A put cut short by shutdown may still have been stored; deleting a
	// key that never was costs nothing, leaving one behind costs a TTL.
	r.ever = true
	if r.rev == 0 {
		if !r.claim(pctx, false) {
			return false
		}
	}
	rev, err := r.Store.PutIf(pctx, r.last.NodeID, r.doc, heartbeat, r.TTL, r.rev)
	if errors.Is(err, store.ErrKeyMoved) {
		// Written by someone else since our last put, or gone (expired
		// while NATS was away, deleted by hand): claim it again, unless
		// another reporter holds it.
		r.rev = 0
		if !r.claim(pctx, true) {
			return false
		}
		rev, err = r.Store.PutIf(pctx, r.last.NodeID, r.doc, false, r.TTL, r.rev)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		r.stored = false
		r.fails++
		r.Metrics.Failed("publish")
		r.Log.WithLevel(r.failLevel()).Err(err).Int("attempt", r.fails).Msg("publishing the inventory failed; retrying")
		return false
	}
	ev := r.Log.Debug()
	switch {
	case r.fails > 0:
		ev = r.Log.Info().Int("failed_attempts", r.fails)
	case !heartbeat:
		ev = r.Log.Info()
	}
	kind := "change"
	if heartbeat {
		kind = "heartbeat"
	}
	ev.Str("kind", kind).Uint64("revision", rev).Int("gpus", len(r.last.GPUs)).Msg("inventory published")
	r.Metrics.Put(kind)
	r.stored, r.fails, r.rev, r.published = true, 0, rev, true
	return true
}

// claim reads the key and takes its revision as the one to replace,
// unless another reporter that still runs wrote it: then it sets stop,
// naming that reporter's host and pid, and the key is left alone. A
// document of no reporter, of this run, or of a reporter of this host
// whose process is gone (a reporter restarted after a crash, its key not
// yet expired) is replaced (live). moved says why claim reads: the key
// changed under this run's writes, rather than this run starting.
func (r *run) claim(ctx context.Context, moved bool) bool {
	st, err := r.Store.State(ctx, r.last.NodeID)
	if err != nil {
		r.stored = false
		r.fails++
		r.Metrics.Failed("publish")
		r.Log.WithLevel(r.failLevel()).Err(err).Int("attempt", r.fails).Msg("reading the inventory key failed; retrying")
		return false
	}
	var other inventory.NodeInventory
	if st.Doc != nil && json.Unmarshal(st.Doc, &other) == nil && other.Reporter != "" && other.Reporter != r.instance {
		why, alive := r.holder(other)
		if moved && !alive {
			// It wrote after this run's own last write: it runs, whatever
			// its pid says here (another pid namespace on this host, two
			// containers both pid 1): taking the key back would have the
			// two take it from each other for ever.
			why, alive = why+", but it wrote after this reporter did", true
		}
		if alive {
			r.stop = r.otherErr(other, st, why)
			r.Log.Error().Err(r.stop).Bool("key_moved", moved).Msg("stopping: another reporter holds this node's key; leaving the key alone")
			return false
		}
		r.Log.Warn().Str("host", other.Hostname).Int("pid", other.ReporterPID).Str("reporter", other.Reporter).Uint64("revision", st.Revision).
			Str("why", why).Msg("taking over the inventory key from a reporter that no longer runs")
	}
	r.rev = st.Revision
	return true
}

// holder tells whether the reporter that wrote other (not this run)
// still runs, and why it is taken to: only one of this host (the same
// hostname and ip as this run's document) can be seen not to; one of
// another host, or one that wrote no pid, is taken to run until its key
// expires.
func (r *run) holder(other inventory.NodeInventory) (why string, alive bool) {
	switch {
	case other.Hostname != r.last.Hostname || other.IP != r.last.IP:
		return "on another host", true
	case other.ReporterPID <= 0:
		return "it wrote no pid", true
	case other.ReporterPID == r.PID:
		if _, ok := instances.Load(other.Reporter); ok {
			return "running in this process", true
		}
		return fmt.Sprintf("pid %d is this process: that reporter is gone", other.ReporterPID), false
	case r.Alive(other.ReporterPID):
		return fmt.Sprintf("pid %d is running on this host", other.ReporterPID), true
	}
	return fmt.Sprintf("pid %d no longer runs on this host", other.ReporterPID), false
}

// otherErr is the error Run stops with when another reporter holds the
// key: that reporter's host, ip and pid, and when the key expires if it
// has stopped renewing it.
func (r *run) otherErr(other inventory.NodeInventory, st store.KeyState, why string) error {
	pid := "pid unknown"
	if other.ReporterPID > 0 {
		pid = fmt.Sprintf("pid %d", other.ReporterPID)
	}
	expiry := ""
	if !st.Expires.IsZero() {
		expiry = fmt.Sprintf("; unless it renews the key, the key expires at %s (in %s) and a reporter may start then",
			st.Expires.UTC().Format(time.RFC3339), max(time.Until(st.Expires), 0).Round(time.Second))
	}
	return fmt.Errorf("node %s: %w: host %s (ip %s), %s, reporter %s, wrote it at revision %d (%s)%s; stop that reporter, or give each host its own --node-id",
		r.last.NodeID, ErrOtherReporter, cmp.Or(other.Hostname, "(none)"), cmp.Or(other.IP, "none"), pid, other.Reporter, st.Revision, why, expiry)
}

func (r *run) scheduleRetry() {
	if r.retryCh != nil {
		return
	}
	if r.doc == nil {
		r.fails++ // the source failed
	}
	d := bus.Backoff(r.fails - 1)
	if r.retry == nil {
		r.retry = time.NewTimer(d)
	} else {
		r.retry.Reset(d)
	}
	r.retryCh = r.retry.C
}

// ownRevision is the key's revision when its document is this run's.
func (r *run) ownRevision(ctx context.Context) (uint64, bool) {
	st, err := r.Store.State(ctx, r.last.NodeID)
	if err != nil || st.Doc == nil {
		return 0, false
	}
	var inv inventory.NodeInventory
	if json.Unmarshal(st.Doc, &inv) != nil {
		return 0, false
	}
	return st.Revision, inv.Reporter == r.instance
}

// shutdown deletes the key, so that the planner drops the node at once
// rather than a TTL later; only if the key's last write is this run's
// (DeleteIf at its revision), never another reporter's.
func (r *run) shutdown() {
	if r.retry != nil {
		r.retry.Stop()
	}
	if !r.ever {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := r.Store.DeleteIf(ctx, r.last.NodeID, r.TTL, r.rev)
	if errors.Is(err, store.ErrKeyMoved) {
		// A put whose answer had not come back yet (stopped right after
		// it) leaves the key at a revision this run does not know: the
		// key is still its own if the document names this run.
		if rev, ours := r.ownRevision(ctx); ours {
			err = r.Store.DeleteIf(ctx, r.last.NodeID, r.TTL, rev)
		}
	}
	if errors.Is(err, store.ErrKeyMoved) {
		r.Log.Warn().Msg("the inventory key was written by something else since; leaving it")
		return
	}
	if err != nil {
		r.Log.Warn().Err(err).Msg("deleting the inventory key failed; it expires after the TTL")
		return
	}
	r.Log.Info().Msg("inventory key deleted")
}
