package service

import (
	"context"
	"fmt"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/store"
)

// specCheckRounds is how many guard rounds pass between two checks of
// the spec bucket's records (about 10 s): a check is a request a key.
const specCheckRounds = 5

// specRecordsDue says whether guard checks the spec records this round:
// every specCheckRounds rounds, and at once after a resync (a server
// that restarted may have come back with records it cannot read).
func (l *loop) specRecordsDue(resync bool) bool {
	l.specRounds++
	if resync || l.specRounds >= specCheckRounds {
		l.specRounds = 0
		return true
	}
	return false
}

// checkSpecRecords says aloud, as a problem naming the plan, each plan
// whose spec record the bucket damaged: one it lists but cannot return
// (a flipped byte; a get says "not found" and a watch never delivers
// it), or one gone without a removal's marker from a bucket that was
// not made anew. Neither is a removal: the plan plans on the spec read
// last, or, with none read in this run, holds its last placement (a job
// without a spec), until its spec is stored again. A plan this planner
// did not know of (restarted on the damage) is read, so that it holds
// its placement rather than leaving its GPUs to others. It returns how
// many records the server lists but cannot read.
func (l *loop) checkSpecRecords(ctx context.Context) int {
	octx, done := l.p.op(ctx, "checking the spec records", l.p.storeTimeout(len(l.p.states)))
	recs, err := l.p.specs.Records(octx)
	done()
	if err != nil {
		l.log.Debug().Err(err).Msg("cannot check the spec records")
		return 0
	}
	for key := range recs.Unreadable {
		if l.p.state(key) == nil && store.ValidatePlanName(key) == nil {
			l.addState(ctx, key, 0)
		}
	}
	for _, s := range l.p.all() {
		why := ""
		switch {
		case recs.Unreadable[s.name]:
			why = fmt.Sprintf("plan %s: its spec record in bucket %s cannot be read (the server lists it but refuses it: a damaged store)", s.name, client.SpecBucket)
		case recs.LastSeq > 0 && !recs.Keys[s.name] && s.claimsSpec():
			why = fmt.Sprintf("plan %s: its spec record is gone from bucket %s without a removal (a damaged store)", s.name, client.SpecBucket)
		}
		if why != "" {
			if s.spec != nil {
				why += "; planning on the spec read last"
			} else {
				why += "; the plan keeps its last placement"
			}
			why += "; store its spec again (planner spec set), or remove it (planner spec rm)"
		}
		if why != s.recordLost && why != "" {
			s.log.Error().Msg(why)
		}
		s.recordLost = why
		l.p.problem("spec-record:"+s.name, why)
	}
	return len(recs.Unreadable)
}

// claimsSpec says whether the plan had a spec no removal ended: one
// read in this run, or a latest revision that does not say it was
// removed.
func (s *planState) claimsSpec() bool {
	if s.removing {
		return false
	}
	return s.spec != nil || s.loaded && s.latest != nil && !s.latest.Plan.Removed()
}
