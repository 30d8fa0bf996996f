package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// A plan's revision numbers never repeat: a launcher that ran revision
// 7 must not take a later, different revision 7 for the same. The plan
// stream is where the sequence lives, but a stream can be lost (a store
// wiped, a stream deleted by hand) while the planner is down. So the
// planner keeps each plan's highest revision, published or seen, in a
// local file outside the JetStream store (Config.StateFile), and
// continues above it: a plan whose stream holds a lower revision, or
// none, gets the next revision after the mark, published whole, with a
// reason that says the history was lost.

// marks are the plans' revision high-water marks, kept in a file; with
// no file, in memory only.
type marks struct {
	path string
	// mu is innermost: nothing is locked while it is held.
	mu sync.Mutex
	m  map[string]int
	// maxWorkers bounds the plans kept whole (maxKeptWorkers).
	maxWorkers int
	// err is the last failure to read or write the file, said once;
	// keepErr, to keep a plan's latest (placements.go).
	err, keepErr error
	// instance is the planner instance (its publisher id) that runs on
	// this file now; before, the one the file named when it was read:
	// the planner that ran on this state last, whose lease, should it
	// have died without giving it back, is its successor's to recognise.
	instance, before string
}

// marksFile is the file's content.
type marksFile struct {
	Revisions map[string]int `json:"revisions"`
	// Instance is the planner instance that last ran on this file.
	Instance string `json:"instance,omitempty"`
}

func newMarks(path string) *marks {
	return &marks{path: path, m: map[string]int{}, maxWorkers: maxKeptWorkers}
}

// load reads the file; a missing one is empty. A file that cannot be
// read is an error: starting without it could number a plan's
// revisions again.
func (k *marks) load() error {
	if k.path == "" {
		return nil
	}
	data, err := os.ReadFile(k.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("revision high-water marks: %w", err)
	}
	var f marksFile
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("revision high-water marks %s: %w (remove the file to start without them)", k.path, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, rev := range f.Revisions {
		k.m[name] = max(k.m[name], rev)
	}
	k.before = f.Instance
	return nil
}

// predecessor is the planner instance the file named when it was read
// ("": none, or no file).
func (k *marks) predecessor() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.before
}

// claim records id as the planner instance that runs on this file, so
// that the next planner to run on it knows this one's lease for its
// predecessor's.
func (k *marks) claim(id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.instance = id
	return k.write()
}

// get is plan name's mark (0: none).
func (k *marks) get(name string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[name]
}

// raise makes rev plan name's mark if it is higher, and writes the file
// (a new file renamed over the old: never half written).
func (k *marks) raise(name string, rev int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if rev <= k.m[name] {
		return nil
	}
	k.m[name] = rev
	return k.write()
}

// write writes the file; k.mu is held.
func (k *marks) write() error {
	if k.path == "" {
		return nil
	}
	data, _ := json.Marshal(marksFile{Revisions: k.m, Instance: k.instance})
	tmp := k.path + ".tmp"
	err := os.MkdirAll(filepath.Dir(k.path), 0o700)
	if err == nil {
		err = os.WriteFile(tmp, data, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, k.path)
	}
	if err != nil {
		return fmt.Errorf("revision high-water marks: %w", err)
	}
	return nil
}

// mark raises plan's mark to rev, logging a failure to keep it once per
// cause.
func (p *Service) mark(s *planState, rev int) {
	k := p.marks
	err := k.raise(s.name, rev)
	k.mu.Lock()
	said := k.err != nil && err != nil && k.err.Error() == err.Error()
	k.err = err
	k.mu.Unlock()
	if err != nil && !said {
		s.log.Error().Err(err).Msg("cannot keep the plan's revision high-water mark: should the plan stream be lost, revision numbers could repeat")
	}
}

// aboveMark is sp, the plan's latest as read from the stream (nil:
// none), or, when the plan published or saw a higher revision before
// (its mark), a stand-in for that revision: unreadable (its placement
// is not known) and orphaned (its event is gone), so that the next
// revision is the one after the mark, published whole.
func (p *loopState) aboveMark(s *planState, sp *store.StoredPlan) *store.StoredPlan {
	mark := p.marks.get(s.name)
	have := 0
	if sp != nil {
		have = sp.Plan.Revision
	}
	if mark <= have {
		if sp != nil {
			p.mark(s, have)
			p.keepPlacement(s, sp)
		} else if p.marks.path == "" {
			// Nothing here can tell a first start from a wiped store.
			s.log.Info().Msg("the plan stream has no revision of the plan and there is no --state-file: it is planned afresh (had the store been wiped, its last placement would be lost: only a state file keeps it)")
		}
		return sp
	}
	why := fmt.Sprintf("the plan history was lost: the plan stream's latest revision is %d, but revision %d was published before", have, mark)
	if sp == nil {
		why = fmt.Sprintf("the plan history was lost: the plan stream has no revision, but revision %d was published before", mark)
	}
	kept, found, err := p.marks.kept(s.name, mark)
	if kept != nil {
		// Its placement known: the plan resumes on it, its nodes
		// settling, and the next revision republishes it whole.
		s.log.Error().Int("stream_revision", have).Int("high_water", mark).
			Msg(why + "; resuming on the placement of revision " + fmt.Sprint(mark) + " as kept in the state file")
		kept.Orphan = true
		if sp != nil {
			kept.Seq = sp.Seq
		}
		return kept
	}
	s.log.Error().Int("stream_revision", have).Int("high_water", mark).
		Msg(why + "; the next revision continues after it")
	p.lostPlacement(s, mark, found, err)
	s.lost = true
	doc := plan.Document{Header: plan.Header{Name: s.name, Revision: mark, Error: why}}
	stand := &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{Base: mark}, Unreadable: true, Orphan: true}
	if sp != nil {
		stand.Seq = sp.Seq // what a publish without the lease expects
	}
	return stand
}
