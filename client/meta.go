package client

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// Meta is what the plan stream says of a revision besides its document:
// where its event sits and what its headers say of where it came from.
// It is the one metadata type of a revision: the store's revisions
// (store.StoredPlan) and the client's (Revision, Info) embed it, so that
// the stream's facts are read and named in one place.
type Meta struct {
	// Seq is the stream sequence of the revision's event: the value to
	// expect on the next publish of the plan. Zero for a revision not
	// read from nor published to the stream (a kept one).
	Seq uint64
	// Base is the revision whose whole placement begins the chain of
	// changes this revision ends (plan.Event.Base): the revision itself
	// when its event carries or names its whole placement.
	Base int
	// SpecDigest is the digest of the spec the revision was planned
	// from (SpecDigestHeader).
	SpecDigest string
	// PlacedFor is, for a revision whose spec is pending, the digest of
	// the spec its placement follows (PlacedForHeader); empty otherwise,
	// or not known (a revision published before planners said it).
	PlacedFor string
	// SpecRevision is the spec bucket revision of the spec the revision
	// was planned from (SpecRevisionHeader); 0 where not known.
	SpecRevision uint64
	// Publisher is the planner instance that published it
	// (PlannerHeader); empty when not known.
	Publisher string
}

// metaOf is the metadata of the event at stream sequence seq with
// headers h.
func metaOf(seq uint64, h nats.Header) Meta {
	base, _ := strconv.Atoi(h.Get(BaseHeader))
	// One that does not parse is not known (0), as one absent.
	specRev, _ := strconv.ParseUint(h.Get(SpecRevisionHeader), 10, 64)
	return Meta{Seq: seq, Base: base, SpecDigest: h.Get(SpecDigestHeader), PlacedFor: h.Get(PlacedForHeader), SpecRevision: specRev, Publisher: h.Get(PlannerHeader)}
}
