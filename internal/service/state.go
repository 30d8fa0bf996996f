package service

import (
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
)

// planState is one plan as the service plans it: its spec, its latest
// revision, its assignments and what changed since that revision. The
// loop's goroutine alone reads and writes it, and takes no lock to;
// other goroutines read the snapshot the loop publishes (planView).
type planState struct {
	name string
	// log names the plan: each line about this plan says which, once.
	// (The loop's own lines, about every plan, name none.)
	log zerolog.Logger
	// latest is the newest stored revision of the plan.
	latest *store.StoredPlan
	spec   *planner.Spec
	digest string
	// specRev is the spec bucket revision spec was read from (0: not
	// known); each revision published says it (client.SpecRevisionHeader).
	specRev uint64
	// specBytes is the spec planned on, as stored, to put back should
	// the bucket be lost; note, what the next revision's reason adds
	// (an outage waited out).
	specBytes []byte
	note      string
	// inherited is the valid plan found at start (or before an outage),
	// whose nodes settle; reported, the nodes heard from since.
	inherited *planner.Plan
	reported  map[string]bool
	// lost is set when the plan's placement was lost with the plan
	// history and nothing kept it (aboveMark): which nodes it was on is
	// unknown, so it waits out Settle whole, the time every reporter
	// takes to put its key again, rather than publish on an inventory
	// the wipe emptied.
	lost bool
	// reconcile is set while the assignment subjects may not match the
	// latest plan (at start, after a failed publish); verify names the
	// nodes of another planner's revision whose assignments to check.
	reconcile bool
	verify    map[string]bool
	// assignSeq is the stream sequence of each node's assignment as this
	// planner last wrote or read it: the one its next write replaces.
	assignSeq map[string]uint64
	// expired are the nodes whose keys vanished other than by their
	// reporter's delete, since they last reported: an outage's, maybe.
	expired map[string]bool
	// basis is the plan's change log: per node changed since its latest
	// revision, its document then (nil: it was not there).
	basis map[string]*inventory.NodeInventory
	// loaded: the plan's latest revision was read (a state made for a
	// spec that just appeared reads it before its first replan); age
	// orders plans of equal priority (the spec's first revision);
	// removing: the spec was removed and the plan's last revision is to
	// say so.
	loaded   bool
	age      uint64
	removing bool
	// recordLost is why its spec record is damaged (checkSpecRecords);
	// empty while it is whole.
	recordLost string
	// shares is planner.HeldShares of sharesOf, the last plan it was
	// summed for: the next revision's is summed from it.
	sharesOf *planner.Plan
	shares   float64
	// followed is the spec followedFor's placement follows, found in the
	// spec's history by followedDigest (followedSpec); followedSaid, the
	// latest whose history could not be read, said once.
	followed       *planner.Spec
	followedFor    *store.StoredPlan
	followedDigest string
	followedSaid   *store.StoredPlan
	// removedAt, when not 0, is the bucket revision of the removal
	// marker the spec watch delivered last (removing, or stored again
	// since, before a replan published the removal): it releases the
	// latest only if that was planned on a spec stored before it
	// (client.SpecRevisionHeader below removedAt), as a planner running
	// through the removal did, and the next revision places the spec
	// afresh. A latest planned on a put after it (another planner
	// published since, the watch behind the plan stream) is kept.
	// removalChecked is the latest known not to be (whose history was
	// read, or that this planner published with its spec watch live).
	removedAt      uint64
	removalChecked *store.StoredPlan
	// rewatched: the spec watch was made again and has not yet delivered
	// this plan's key; its first entry, a put of another revision than
	// specRev, clears removalChecked (a removal in the gap is not
	// delivered: the history tells it).
	rewatched bool
	// renumberedFor is the latest whose spec revision is of a spec
	// bucket since made again (its revisions number from 1 again): not
	// known for it (latestSpecRev). renumberAsked is what checkRenumbered
	// last read the history for, not to read it at every replan.
	renumberedFor *store.StoredPlan
	renumberAsked renumberKey
}

// renumberKey is what checkRenumbered read a plan's spec history for.
type renumberKey struct {
	latest             *store.StoredPlan
	specRev, removedAt uint64
}

// heldShares is planner.HeldShares(next), summed from prev's where that
// is the plan summed last (next made from prev reads only the nodes its
// run touched).
func (s *planState) heldShares(prev, next *planner.Plan) float64 {
	switch {
	case next == s.sharesOf:
	case prev != nil && prev == s.sharesOf:
		s.shares = planner.HeldSharesFrom(prev, next, s.shares)
	default:
		s.shares = planner.HeldShares(next)
	}
	s.sharesOf = next
	return s.shares
}

func newPlanState(name string, log zerolog.Logger) *planState {
	return &planState{name: name, log: log.With().Str("plan", name).Logger(), reported: map[string]bool{},
		assignSeq: map[string]uint64{}, expired: map[string]bool{}, basis: map[string]*inventory.NodeInventory{}}
}

// planned says whether the loop plans the plan: it has a spec, its
// removal is still to say, or its last revision holds workers.
func (s *planState) planned() bool {
	return s.spec != nil || s.removing || s.latest != nil && s.latest.Plan.Placed() && !s.latest.Plan.Removed()
}

// remember keeps a node's document as it was at the plan's latest
// revision, the first time it changes after.
func (s *planState) remember(id string, old inventory.NodeInventory, present bool) {
	if _, ok := s.basis[id]; ok {
		return
	}
	if present {
		s.basis[id] = &old
	} else {
		s.basis[id] = nil
	}
}

// latestPlan is the plan's latest revision (nil: none).
func (s *planState) latestPlan() *planner.Plan {
	if s.latest == nil {
		return nil
	}
	return s.latest.Plan
}

// revision is the latest revision's number (0: none).
func (s *planState) revision() int {
	if s.latest == nil {
		return 0
	}
	return s.latest.Plan.Revision
}

// unreported lists the nodes of the plan found at start (or before an
// outage) that have not reported since, sorted.
func (s *planState) unreported() []string {
	var out []string
	if s.inherited == nil {
		return out
	}
	for _, pl := range s.inherited.Pools {
		for _, n := range pl.Nodes.All() {
			if !s.reported[n.NodeID] && !slices.Contains(out, n.NodeID) {
				out = append(out, n.NodeID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// settling is how much longer a freshly started planner waits before
// replanning away from the plan it found, while nodes of that plan have
// not reported since start. After a restart of the planner and its
// embedded server the inventory fills up as reporters reconnect;
// planning on the first, partial view would move every worker. A node
// that reported and then left is not waited for, nor is a plan this
// planner made. left is how much of the settle time is left.
func (s *planState) settling(left time.Duration) time.Duration {
	if left <= 0 {
		return 0
	}
	if s.lost {
		return left
	}
	if s.inherited == nil {
		return 0
	}
	for _, pl := range s.inherited.Pools {
		for _, n := range pl.Nodes.All() {
			if !s.reported[n.NodeID] {
				return left
			}
		}
	}
	return 0
}
