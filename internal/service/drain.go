package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// Nodes and GPUs out of placement on purpose. An operator drains them
// (planner drain: a record in the drain bucket, read by a watch of its
// own); the planner holds out a GPU that recovered (on probation for
// Config.Probation), and a GPU that turned unhealthy, or a node whose
// key ran out, FlapCount times within FlapWindow (written to the bucket
// as a drain of cause flapping, so that it holds across restarts until
// an undrain). Each is applied to the view's planner nodes as drained
// GPUs (planner.Node.Drained, Out): the usual keep-or-move rule then
// moves exactly their workers, displaced for planner.WhyDrained, and
// places nothing new there. A drain whose deadline has not passed takes
// out only the GPUs no plan's workers use: no new work, and the workers
// there stay until the deadline (a GPU a worker shares in part may
// still take more shares meanwhile).

// DefaultProbation is how long a GPU that recovered stays out before
// the planner places on it again (serve --probation).
const DefaultProbation = 10 * time.Minute

// A GPU that turned unhealthy, or a node whose key ran out, FlapCount
// times within FlapWindow is held out until an operator undrains it.
const (
	FlapCount  = 3
	FlapWindow = time.Hour
)

// drains is the service's drain state. The loop's goroutine alone uses
// it (the watch's goroutine sends it whole sets on updates).
type drains struct {
	// in: the bucket's contents were read; no replan before (a plan
	// made without the drains would place on drained GPUs).
	in bool
	// byKey are the drains in force, by bucket key: the bucket's, and
	// the hold-outs not (yet) seen there.
	byKey map[string]store.Drain
	// unstored are this planner's hold-outs the watch has not brought
	// from the bucket yet: a standby's (the leader stores its own), or
	// the leader's whose Put failed (storeHoldOuts tries again, from
	// retryAt; tries counts the failures in a row). A bucket change
	// leaves them in force: they hold until an undrain, and the watch
	// cannot undrain what it never had.
	unstored map[string]*holdOut
	retryAt  time.Time
	tries    int
	// updates brings the bucket's drains, whole, at each change;
	// restart has the watch made again (restartWatches: a reconnect, a
	// stall, a bucket lost and made again, where the old watch would
	// resume past the restored drains' sequences).
	updates chan map[string]store.Drain
	restart chan struct{}
	// notes bring the watch's problems, for the loop to record.
	notes chan problemNote
	// timer fires at the next deadline, probation's end or expiry to
	// count; at, when.
	timer Timer
	at    time.Time
	// health is what the planner saw of each GPU (node:index) turning
	// unhealthy and recovering; seen, each node's GPUs as last reported
	// (the report, not the view's document, which marks GPUs another
	// node claims; the report's own list, which nothing changes, not a
	// copy: a map of UUIDs per node was 9 MB at 20,000 nodes), health
	// by UUID; touched, the nodes whose documents changed since the
	// last refresh.
	health map[string]*gpuHealth
	lost   map[string]*gpuHealth // nodes whose key ran out, by id
	// expiries are the keys that ran out lately, not yet counted: one
	// counts once burstWindow has passed, unless it was one of a burst
	// (most nodes at once: an outage, not the node) or came soon after
	// this planner's NATS connection came back; reconnects and
	// reconnected are that connection's count and when it last grew.
	expiries    []expiry
	reconnects  uint64
	reconnected time.Time
	seen        map[string][]inventory.GPU
	touched     map[string]bool
	// leaving are the drains whose deadline has not passed; count, the
	// GPUs out now by cause (the gauge).
	leaving []store.Drain
	count   map[string]int
}

// holdOut is a hold-out not yet seen in the drain bucket; stored: this
// planner's Put of it succeeded (the watch brings it soon).
type holdOut struct {
	d      store.Drain
	stored bool
}

// gpuHealth is one GPU's recent health: when it turned unhealthy
// (within FlapWindow), until when it is on probation, and whether it
// is held out for flapping.
type gpuHealth struct {
	sick      []time.Time
	probation time.Time
	held      bool
}

func newDrains(c Clock) *drains {
	t := c.NewTimer(time.Hour)
	t.Stop()
	return &drains{byKey: map[string]store.Drain{}, unstored: map[string]*holdOut{}, updates: make(chan map[string]store.Drain, 1), restart: make(chan struct{}, 1),
		notes: make(chan problemNote, 8), timer: t,
		health: map[string]*gpuHealth{}, lost: map[string]*gpuHealth{}, seen: map[string][]inventory.GPU{}, touched: map[string]bool{}, count: map[string]int{}}
}

// nodeOut is what of one node is out: GPUs by index, or the whole node.
type nodeOut struct {
	gpus  []int
	whole bool
}

func (o nodeOut) empty() bool { return !o.whole && len(o.gpus) == 0 }

func (o nodeOut) equal(x nodeOut) bool { return o.whole == x.whole && slices.Equal(o.gpus, x.gpus) }

// apply marks n's drained GPUs.
func (o nodeOut) apply(n planner.Node) planner.Node {
	if o.empty() {
		return n
	}
	n.Out = o.whole
	for _, g := range o.gpus {
		if g >= 0 && g < n.GPUs {
			n.Drained = append(n.Drained, g)
		}
	}
	return n
}

// setOut makes o what is out of node id, and reports whether that
// changed; a node in the view gets its planner node again.
func (v *view) setOut(id string, o nodeOut) bool {
	if v.out[id].equal(o) {
		return false
	}
	if v.out == nil {
		v.out = map[string]nodeOut{}
	}
	if o.empty() {
		delete(v.out, id)
	} else {
		v.out[id] = o
	}
	if doc, ok := v.docs[id]; ok {
		if n, err := doc.PlannerNode(); err == nil {
			v.nodes[id] = o.apply(n)
			v.touch(id)
		}
	}
	return true
}

// touch notes that node id's document changes, for the GPU health
// refresh reads.
func (d *drains) touch(id string) { d.touched[id] = true }

// watchDrains follows the drain bucket until ctx ends, sending the
// drains in force, whole, once the bucket's contents are read and at
// every change after; a watch that fails or ends is made again, as is
// one restart asks to be (at once). What it cannot read it tells on
// notes, for the loop's health.
func (p *Service) watchDrains(ctx context.Context, out chan<- map[string]store.Drain, restart <-chan struct{}, notes chan<- problemNote) {
	// Made at start (p.drains binds, never makes); a bucket lost since
	// is the guard's to make again, with the drains this planner knows
	// (restoreDrains): a watch that made it empty would undrain
	// everything.
	for attempt := 0; ctx.Err() == nil; attempt++ {
		made, err := p.followDrains(ctx, out, restart, notes)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRestart) {
			attempt = -1
			continue
		}
		if made {
			// A watch made failed later (the bucket went away under it):
			// watchNote said nothing of it.
			note(ctx, notes, problemNote{"drains", fmt.Sprintf("cannot read the drain bucket %s: %v (no replan until it is read)", client.DrainBucket, err)})
		} else {
			note(ctx, notes, problemNote{key: "drains"}) // watchNote says it, once
		}
		p.cfg.Log.Warn().Err(err).Msg("drain watch failed; retrying")
		c, stop := p.after(bus.Backoff(attempt))
		select {
		case <-ctx.Done():
			stop()
			return
		case <-restart:
			stop()
		case <-c:
		}
	}
}

// note tells the loop n, unless ctx ends first.
func note(ctx context.Context, notes chan<- problemNote, n problemNote) {
	select {
	case notes <- n:
	case <-ctx.Done():
	}
}

// errRestart ends a drain watch that restartWatches asked to make again.
var errRestart = errors.New("the drain watch is made again")

// followDrains is one watch of the drain bucket; made says whether the
// watch was made (a failure to make it, the bucket missing included, is
// said by watchNote, as the inventory's and the specs' are: it leaves the
// planner blind to the drains, and unable to replan until they are
// read).
func (p *Service) followDrains(ctx context.Context, out chan<- map[string]store.Drain, restart <-chan struct{}, notes chan<- problemNote) (made bool, err error) {
	kctx, cancel := context.WithTimeout(ctx, p.cfg.StoreTimeout)
	kv, err := p.drains.Bucket(kctx)
	cancel()
	if err == nil {
		var w jetstream.KeyWatcher
		if w, err = kv.WatchAll(ctx); err == nil {
			note(ctx, notes, p.watchNote("drains", nil))
			defer func() { _ = w.Stop() }()
			return true, p.drainUpdates(ctx, w, out, restart, notes)
		}
		err = fmt.Errorf("watch drains: %w", err)
	}
	if ctx.Err() != nil {
		return false, err // stopping: no failure to say
	}
	note(ctx, notes, p.watchNote("drains", fmt.Errorf("%w (no replan until the drains are read)", err)))
	return false, err
}

// drainUpdates sends what watch w brings, as watchDrains says.
func (p *Service) drainUpdates(ctx context.Context, w jetstream.KeyWatcher, out chan<- map[string]store.Drain, restart <-chan struct{}, notes chan<- problemNote) error {
	set := map[string]store.Drain{}
	synced := false
	send := func() bool {
		select {
		case out <- maps.Clone(set):
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-restart:
			return errRestart
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the drain watch ended")
			}
			if e == nil {
				synced = true
				note(ctx, notes, problemNote{key: "drains"})
				if !send() {
					return nil
				}
				continue
			}
			p.foldDrain(set, e)
			if synced && !send() {
				return nil
			}
		}
	}
}

// restoreDrains makes the drain bucket again, lost (a server that lost
// its storage), and puts back the drains this planner knows: an
// operator's drain holds until an undrain, whatever became of the
// bucket. A drain stored since stays.
func (p *loopState) restoreDrains(ctx context.Context) error {
	kv, err := p.drains.Ensure(ctx)
	if err != nil {
		return err
	}
	for _, k := range slices.Sorted(maps.Keys(p.drain.byKey)) {
		data, err := json.Marshal(p.drain.byKey[k])
		if err == nil {
			_, err = kv.Create(ctx, k, data)
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("restore the drain %s: %w", k, err)
		}
	}
	return nil
}

// foldDrain folds one entry of the drain bucket into set; a record that
// does not decode is logged and leaves the key undrained.
func (p *Service) foldDrain(set map[string]store.Drain, e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		delete(set, key)
		return
	}
	d, err := store.DecodeDrain(key, e.Value())
	switch {
	case err != nil:
		p.cfg.Log.Warn().Err(err).Str("key", key).Msg("a drain record that does not decode: ignored")
		delete(set, key)
	case d.Undrained:
		delete(set, key)
	default:
		set[key] = d
	}
}

// drainsRead takes the bucket's drains, with the hold-outs not seen
// there yet: drains ended forget the GPU health that held them out (an
// undrained flapping GPU starts afresh).
func (p *loopState) drainsRead(set map[string]store.Drain) {
	d := p.drain
	for k, h := range d.unstored {
		if _, ok := set[k]; ok {
			delete(d.unstored, k) // stored (by this planner or the leader)
			continue
		}
		set[k] = h.d
	}
	for k, old := range d.byKey {
		if _, ok := set[k]; ok {
			continue
		}
		if old.GPU != nil {
			delete(d.health, healthKey(old.NodeID, *old.GPU))
		} else {
			delete(d.lost, old.NodeID)
		}
	}
	for k, n := range set {
		if _, ok := d.byKey[k]; !ok {
			p.cfg.Log.Info().Str("target", n.Target()).Str("cause", n.Cause).Str("reason", n.Reason).Str("by", n.By).Msg("drained")
		}
	}
	for k, o := range d.byKey {
		if _, ok := set[k]; !ok {
			p.cfg.Log.Info().Str("target", o.Target()).Msg("undrained")
		}
	}
	d.byKey, d.in = set, true
	p.refreshOut()
}

func healthKey(node string, gpu int) string { return node + ":" + strconv.Itoa(gpu) }

// probation is Config.Probation: DefaultProbation when zero, none when
// negative.
func (p *Service) probation() time.Duration {
	switch {
	case p.cfg.Probation == 0:
		return DefaultProbation
	case p.cfg.Probation < 0:
		return 0
	}
	return p.cfg.Probation
}

// refreshOut brings what is out of placement up to date, as of the
// service's clock: the GPUs whose health changed, every drain in force
// and its deadline, probations; it applies them to the view, sets the
// gauge and arms the timer for the next deadline or probation's end.
func (p *loopState) refreshOut() {
	now := p.clock.Now()
	p.readHealth(now)
	t := &outTally{now: now, nodes: map[string]*nodeOut{}, count: map[string]int{}}
	t.soonest(p.countLost(now))
	p.drainsOut(t)
	for id, h := range p.drain.lost {
		if !h.held && (len(h.sick) == 0 || now.Sub(h.sick[len(h.sick)-1]) >= FlapWindow) {
			delete(p.drain.lost, id)
		}
	}
	p.probationOut(t)
	p.applyOut(t)
}

// outTally is what refreshOut finds out of placement: each node's
// nodeOut, the GPUs out by cause (the drained gauge's), and the soonest
// time after now that any of it changes (zero: none).
type outTally struct {
	now   time.Time
	nodes map[string]*nodeOut
	count map[string]int
	next  time.Time
}

// node is node id's nodeOut, made on first use.
func (t *outTally) node(id string) *nodeOut {
	if t.nodes[id] == nil {
		t.nodes[id] = &nodeOut{}
	}
	return t.nodes[id]
}

// soonest notes a time something changes (one not after now: none).
func (t *outTally) soonest(at time.Time) {
	if at.After(t.now) && (t.next.IsZero() || at.Before(t.next)) {
		t.next = at
	}
}

// drainsOut takes the drains: one past its deadline (or with none)
// takes its node or GPU out whole; before its deadline only the GPUs no
// plan uses are out, so nothing new lands there (the drain's leaving).
func (p *loopState) drainsOut(t *outTally) {
	d := p.drain
	d.leaving = d.leaving[:0]
	var used func(node string, gpu int) bool
	for _, k := range slices.Sorted(maps.Keys(d.byKey)) {
		dr := d.byKey[k]
		doc, present := p.live.doc(dr.NodeID)
		if dr.Deadline == nil || !t.now.Before(*dr.Deadline) {
			o := t.node(dr.NodeID)
			cause := "operator"
			if dr.Cause == plan.DrainFlapping {
				cause = "flapping"
			}
			if dr.GPU == nil {
				o.whole = true
				t.count[cause] += len(doc.GPUs)
			} else {
				o.gpus = append(o.gpus, *dr.GPU)
				if present && *dr.GPU < len(doc.GPUs) {
					t.count[cause]++
				}
			}
			continue
		}
		t.soonest(*dr.Deadline)
		d.leaving = append(d.leaving, dr)
		if used == nil {
			used = p.usedGPUs()
		}
		for _, g := range drainGPUs(dr, doc) {
			if used(dr.NodeID, g) {
				t.count["leaving"]++
			} else {
				o := t.node(dr.NodeID)
				o.gpus = append(o.gpus, g)
			}
		}
	}
}

// probationOut takes the GPUs on probation out, and forgets a GPU's
// health once nothing is left to remember (one that turned unhealthy
// once, long ago).
func (p *loopState) probationOut(t *outTally) {
	for k, h := range p.drain.health {
		if !h.held && !h.probation.After(t.now) && (len(h.sick) == 0 || t.now.Sub(h.sick[len(h.sick)-1]) >= FlapWindow) {
			delete(p.drain.health, k)
			continue
		}
		if h.probation.After(t.now) {
			node, gpu, _ := strings.Cut(k, ":")
			g, _ := strconv.Atoi(gpu)
			o := t.node(node)
			o.gpus = append(o.gpus, g)
			t.count["probation"]++
			t.soonest(h.probation)
		}
	}
}

// applyOut sets each node's nodeOut in the live view (nodes no longer
// out: none), the drained gauge, and the timer of the next change.
func (p *loopState) applyOut(t *outTally) {
	d := p.drain
	for _, id := range slices.Collect(maps.Keys(p.live.out)) {
		if t.nodes[id] == nil {
			p.live.setOut(id, nodeOut{})
		}
	}
	for id, o := range t.nodes {
		slices.Sort(o.gpus)
		o.gpus = slices.Compact(o.gpus)
		p.live.setOut(id, *o)
	}
	d.count = t.count
	p.cfg.Metrics.Drained(t.count) // every cause, zero included, from the first refresh on
	if !t.next.Equal(d.at) {
		d.at = t.next
		d.timer.Stop()
		if !t.next.IsZero() {
			d.timer.Reset(t.next.Sub(t.now))
		}
	}
}

// drainGPUs are the GPU indices drain dr takes out of node doc.
func drainGPUs(dr store.Drain, doc inventory.NodeInventory) []int {
	if dr.GPU != nil {
		return []int{*dr.GPU}
	}
	out := make([]int, len(doc.GPUs))
	for i := range out {
		out[i] = i
	}
	return out
}

// usedGPUs reports whether any plan's latest revision has a worker on a
// GPU.
func (p *loopState) usedGPUs() func(node string, gpu int) bool {
	var index []func(string) []plan.Worker
	for _, s := range p.states {
		if l := s.latestPlan(); l != nil && l.Placed() {
			index = append(index, l.NodeIndex())
		}
	}
	return func(node string, gpu int) bool {
		for _, on := range index {
			for _, w := range on(node) {
				if slices.Contains(w.GPUs, gpu) {
					return true
				}
			}
		}
		return false
	}
}

// readHealth reads what the nodes changed since the last refresh say of
// their GPUs' health: a GPU that recovered goes on probation; one that
// turned unhealthy FlapCount times within FlapWindow is held out (a
// drain of cause flapping, which the leader stores).
func (p *loopState) readHealth(now time.Time) {
	d := p.drain
	for id := range d.touched {
		doc, ok := p.node(id)
		if !ok {
			delete(d.seen, id) // a node that comes back says nothing of its GPUs' past
			continue
		}
		was := d.seen[id]
		d.seen[id] = doc.GPUs
		for _, g := range doc.GPUs {
			before, known := healthOf(was, g.UUID)
			if !known || before == g.Healthy {
				continue
			}
			k := healthKey(id, g.Index)
			h := d.health[k]
			if h == nil {
				h = &gpuHealth{}
				d.health[k] = h
			}
			if g.Healthy {
				if pr := p.probation(); pr > 0 && !h.held {
					h.probation = now.Add(pr)
					p.cfg.Log.Info().Str("gpu", k).Str("until", h.probation.UTC().Format(time.RFC3339)).Msg("GPU healthy again: on probation before it gets work")
				}
				continue
			}
			h.probation = time.Time{}
			h.sick = append(slices.DeleteFunc(h.sick, func(t time.Time) bool { return now.Sub(t) >= FlapWindow }), now)
			if len(h.sick) >= FlapCount && !h.held {
				h.held = true
				p.holdOut(id, g.Index, now)
			}
		}
	}
	clear(d.touched)
}

// healthOf is whether the GPU of gpus with UUID uuid is healthy, the
// last listed where a list names it twice, and whether one is listed.
func healthOf(gpus []inventory.GPU, uuid string) (healthy, listed bool) {
	for i := len(gpus) - 1; i >= 0; i-- {
		if gpus[i].UUID == uuid {
			return gpus[i].Healthy, true
		}
	}
	return false, false
}

// expiry is a node's key running out, at when, of nodes known then.
type expiry struct {
	id    string
	at    time.Time
	nodes int
	// outage: it came soon after the planner's connection came back;
	// done: counted (or found an outage's).
	outage, done bool
}

// burstWindow is how close together key expiries are one burst.
const burstWindow = 10 * time.Second

// nodeLost notes that node id's key ran out (its reporter died without
// a word, or lost NATS), to count once it is clear it was no outage
// (countLost).
func (p *loopState) nodeLost(id string) {
	d, now := p.drain, p.clock.Now()
	if p.cfg.NC != nil {
		if r := p.cfg.NC.Stats().Reconnects; r != d.reconnects {
			d.reconnects, d.reconnected = r, now
		}
	}
	outage := !d.reconnected.IsZero() && now.Sub(d.reconnected) < max(p.cfg.Settle, burstWindow)
	d.expiries = append(d.expiries, expiry{id: id, at: now, nodes: len(p.live.docs) + 1, outage: outage})
}

// countLost counts the expiries burstWindow old: those of a burst that
// took most nodes at once, or that came soon after a reconnect, were
// an outage's and count nothing. It returns when the next one is due
// (zero: none waits).
func (p *loopState) countLost(now time.Time) time.Time {
	d := p.drain
	var next time.Time
	for i := range d.expiries {
		e := &d.expiries[i]
		if e.done {
			continue
		}
		if now.Sub(e.at) < burstWindow {
			if next.IsZero() {
				next = e.at.Add(burstWindow)
			}
			continue
		}
		burst := 0
		for _, o := range d.expiries {
			if o.at.Sub(e.at).Abs() < burstWindow {
				burst++
			}
		}
		e.done = true
		if !e.outage && (burst < 2 || burst*2 <= e.nodes) {
			p.lostCounted(e.id, e.at)
		}
	}
	// The counted stay while a later one may be of their burst.
	d.expiries = slices.DeleteFunc(d.expiries, func(e expiry) bool { return e.done && now.Sub(e.at) >= 2*burstWindow })
	return next
}

// lostCounted counts node id's key running out at when: a node that
// does so FlapCount times within FlapWindow is held out whole until an
// operator undrains it.
func (p *loopState) lostCounted(id string, now time.Time) {
	d := p.drain
	h := d.lost[id]
	if h == nil {
		h = &gpuHealth{}
		d.lost[id] = h
	}
	h.sick = append(slices.DeleteFunc(h.sick, func(t time.Time) bool { return now.Sub(t) >= FlapWindow }), now)
	if len(h.sick) >= FlapCount && !h.held {
		h.held = true
		p.holdOutDrain(store.Drain{NodeID: id, Cause: plan.DrainFlapping, By: "planner", At: now.UTC(),
			Reason: fmt.Sprintf("left unannounced %d times within %s; planner undrain %s puts it back", FlapCount, FlapWindow, id)})
	}
}

// holdOut holds GPU gpu of node id out for flapping: a drain of cause
// flapping in force at once, stored by the leader so that it holds
// until an operator undrains it.
func (p *loopState) holdOut(id string, gpu int, now time.Time) {
	p.holdOutDrain(store.Drain{NodeID: id, GPU: &gpu, Cause: plan.DrainFlapping, By: "planner", At: now.UTC(),
		Reason: fmt.Sprintf("unhealthy %d times within %s; planner undrain %s:%d puts it back", FlapCount, FlapWindow, id, gpu)})
}

// holdOutDrain puts hold-out dr in force at once, and has the leader
// store it.
func (p *loopState) holdOutDrain(dr store.Drain) {
	if _, ok := p.drain.byKey[dr.Key()]; ok {
		return // drained already
	}
	p.drain.byKey[dr.Key()] = dr
	p.drain.unstored[dr.Key()] = &holdOut{d: dr}
	p.cfg.Log.Warn().Str("target", dr.Target()).Str("reason", dr.Reason).Msg("keeps failing: held out until an undrain")
	p.storeHoldOuts(context.Background(), true)
}

// storeHoldOuts has the leader store the hold-outs not in the bucket
// yet (a standby leaves them to the leader, which saw the same, or to
// itself once it leads); a failure is tried again from the guard, with
// a backoff, unless now says to try at once (a hold-out just made, the
// lease just taken). Until stored, a hold-out holds on this planner
// only, and planner undrain does not find it.
func (p *loopState) storeHoldOuts(ctx context.Context, now bool) {
	d := p.drain
	if !p.leads() || (!now && p.clock.Now().Before(d.retryAt)) {
		return
	}
	// A lost bucket is the guard's to make again, with every drain this
	// planner knows (restoreDrains); one made here would lack them (the
	// store's Put never makes it).
	for _, k := range slices.Sorted(maps.Keys(d.unstored)) {
		h := d.unstored[k]
		if h.stored {
			continue
		}
		octx, done := p.op(ctx, "storing the hold-out of "+h.d.Target(), p.cfg.StoreTimeout)
		err := p.drains.Put(octx, h.d)
		done()
		if err != nil {
			d.tries++
			d.retryAt = p.clock.Now().Add(bus.Backoff(d.tries))
			p.cfg.Log.Error().Err(err).Str("target", h.d.Target()).Msg("cannot store the hold-out: it holds on this planner, and is stored again later")
			return
		}
		h.stored = true
	}
	d.tries, d.retryAt = 0, time.Time{}
}

// drainOf is the drain (or hold-out) that a worker displaced for
// planner.WhyDrained at where ("n2" or "n2:3") left; false when none is
// known (it ended meanwhile).
func (p *loopState) drainOf(where string) (plan.Drain, bool) {
	node, idx, isGPU := strings.Cut(where, ":")
	if isGPU {
		g, err := strconv.Atoi(idx)
		if err != nil {
			return plan.Drain{}, false
		}
		if dr, ok := p.drain.byKey[store.DrainKey(node, &g)]; ok {
			return dr.Plan(), true
		}
		if h := p.drain.health[where]; h != nil && h.probation.After(p.clock.Now()) {
			return plan.Drain{NodeID: node, GPU: &g, Cause: plan.DrainProbation,
				Reason: "recovered; back at " + h.probation.UTC().Format(time.RFC3339)}, true
		}
	}
	if dr, ok := p.drain.byKey[store.DrainKey(node, nil)]; ok {
		return dr.Plan(), true
	}
	return plan.Drain{}, false
}

// noteDrains says, in each plan's next revision, which drains moved its
// workers or keep them unplaced (Status.Drained, and the reason), and
// which drains its workers are leaving by their deadline
// (Status.Leaving): changes[i] are plan i's reason parts.
func (p *loopState) noteDrains(planned []*planState, outs []planner.Outcome, changes [][]string) {
	for i, s := range planned {
		o := outs[i]
		if s == nil || o.Plan == nil {
			continue
		}
		var drained []plan.Drain
		seen := map[string]bool{}
		all := append(slices.Clone(displacedOf(o.Change)), unplacedOf(o.Change)...)
		for _, dp := range all {
			if dp.Why != planner.WhyDrained || seen[dp.Where] {
				continue
			}
			seen[dp.Where] = true
			if dr, ok := p.drainOf(dp.Where); ok && !slices.ContainsFunc(drained, func(x plan.Drain) bool { return x.Target() == dr.Target() }) {
				drained = append(drained, dr)
			}
		}
		var leaving []plan.Drain
		if len(p.drain.leaving) > 0 {
			on := o.Plan.NodeIndex()
			for _, dr := range p.drain.leaving {
				for _, w := range on(dr.NodeID) {
					if dr.GPU == nil || slices.Contains(w.GPUs, *dr.GPU) {
						leaving = append(leaving, dr.Plan())
						break
					}
				}
			}
		}
		if len(drained) == 0 && len(leaving) == 0 {
			continue
		}
		slices.SortFunc(drained, func(a, b plan.Drain) int { return strings.Compare(a.Target(), b.Target()) })
		st := o.Plan.Status
		st.Drained, st.Leaving = drained, leaving
		if st.State == plan.StateDegraded && st.Reason == plan.ReasonSpec && len(drained) > 0 && allDrained(o.Plan.Unplaced) {
			// No room elsewhere for what the drains moved off.
			st.Reason = plan.ReasonDrained
		}
		o.Plan.Status = st
		for _, dr := range drained {
			changes[i] = append(changes[i], dr.Text(false))
		}
		for _, dr := range leaving {
			changes[i] = append(changes[i], dr.Text(true))
		}
	}
}

func displacedOf(c *planner.Change) []planner.Displaced {
	if c == nil {
		return nil
	}
	return c.Displaced
}

func unplacedOf(c *planner.Change) []planner.Displaced {
	if c == nil {
		return nil
	}
	return c.Unplaced
}

// allDrained reports whether every unplaced worker left a drained node
// or GPU.
func allDrained(us []plan.Unplaced) bool {
	for _, u := range us {
		if !strings.HasPrefix(u.Reason, planner.WhyDrained+" ") {
			return false
		}
	}
	return len(us) > 0
}

// DrainView is a drain or hold-out as status and the GPU map show it.
type DrainView struct {
	plan.Drain
	// Leaving: its deadline has not passed; the workers there stay
	// until it does.
	Leaving bool      `json:"leaving,omitempty"`
	By      string    `json:"by,omitempty"`
	At      time.Time `json:"at,omitempty"`
}

// drainViews are the drains and hold-outs in force now, by target.
func (p *loopState) drainViews() []DrainView {
	now := p.clock.Now()
	var out []DrainView
	for _, dr := range p.drain.byKey {
		out = append(out, DrainView{Drain: dr.Plan(), Leaving: dr.Deadline != nil && now.Before(*dr.Deadline), By: dr.By, At: dr.At})
	}
	for k, h := range p.drain.health {
		if h.probation.After(now) {
			node, gpu, _ := strings.Cut(k, ":")
			g, _ := strconv.Atoi(gpu)
			dr, _ := p.drainOf(k)
			if dr.Cause == plan.DrainProbation {
				out = append(out, DrainView{Drain: plan.Drain{NodeID: node, GPU: &g, Cause: plan.DrainProbation, Reason: dr.Reason}})
			}
		}
	}
	slices.SortFunc(out, func(a, b DrainView) int { return strings.Compare(a.Target(), b.Target()) })
	return out
}

// Drains is what is out of placement on purpose, as of the loop's last
// snapshot: drains, hold-outs and probations.
func (p *Service) Drains() []DrainView { return p.view().drains }

// DrainedGPUs is Drains as the GPU map marks them (gpumap.Drains).
func (p *Service) DrainedGPUs() []plan.Drain {
	ds := p.Drains()
	out := make([]plan.Drain, len(ds))
	for i, d := range ds {
		out[i] = d.Drain
	}
	return out
}
