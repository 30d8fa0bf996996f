package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/planner"
	"github.com/poolplanner/poolplanner/internal/store"
	"github.com/poolplanner/poolplanner/plan"
)

// A wiped store loses the plans' placements with their history. The
// marks keep the revision numbers; beside them the planner keeps each
// plan's latest revision whole, so that a planner started on a wiped
// store resumes every plan where it was (its nodes settle as after any
// restart, and the next revision republishes the placement) instead of
// publishing an empty plan and then a fresh one moving every worker.

// maxKeptWorkers bounds the plans kept whole: writing the plan at each
// revision costs what encoding it does (about 200 bytes a worker, 75 ms
// at 100,000 workers and 1.2 s at a million on a loaded 2-core machine:
// BenchmarkKeepPlacement); a larger plan resumes from its revision
// number only, and says so.
const maxKeptWorkers = 1_000_000

// keptPlan is one kept plan's file.
type keptPlan struct {
	SpecDigest string `json:"spec_digest,omitempty"`
	// PlacedFor is the revision's client.Meta.PlacedFor (a pending
	// spec's revision: the spec its placement follows).
	PlacedFor string `json:"placed_for,omitempty"`
	// SpecRevision is the revision's client.Meta.SpecRevision (0: not
	// known, as in files from before planners kept it), so that its
	// next revision, after a wiped store, says the same of it.
	SpecRevision uint64          `json:"spec_revision,omitempty"`
	Document     json.RawMessage `json:"document"`
}

// placementPath is where plan name's latest revision is kept ("": no
// state file). Plan names are file names (store.PlanNameRule).
func (k *marks) placementPath(name string) string {
	if k.path == "" {
		return ""
	}
	return filepath.Join(strings.TrimSuffix(k.path, filepath.Ext(k.path))+"-plans", name+".json")
}

// keep writes sp as plan name's latest revision kept; a plan too large
// to keep has its file removed, so that an older placement is never
// taken for its latest.
func (k *marks) keep(name string, sp *store.StoredPlan) error {
	path := k.placementPath(name)
	if path == "" || sp == nil || sp.Unreadable || sp.Plan == nil {
		return nil
	}
	if sp.Plan.Workers.Len() > k.maxWorkers {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kept plan %s: %w", name, err)
		}
		return nil
	}
	data := appendKept(nil, sp.Meta, &sp.Plan.Document)
	tmp := path + ".tmp"
	err := os.MkdirAll(filepath.Dir(path), 0o700)
	if err == nil {
		err = os.WriteFile(tmp, data, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("kept plan %s: %w", name, err)
	}
	return nil
}

// appendKept appends the keptPlan of doc: the document by its own
// encoder (plan.Document.AppendJSON), not json.Marshal, which would
// check a document's JSON twice over (its workers' MarshalJSON, then
// the raw message), the most of what keeping cost at every revision.
func appendKept(b []byte, m client.Meta, doc *plan.Document) []byte {
	b = append(b, `{"spec_digest":`...)
	d, _ := json.Marshal(m.SpecDigest) // a string: cannot fail
	b = append(b, d...)
	if m.PlacedFor != "" {
		b = append(b, `,"placed_for":`...)
		d, _ = json.Marshal(m.PlacedFor)
		b = append(b, d...)
	}
	if m.SpecRevision != 0 {
		b = append(b, `,"spec_revision":`...)
		b = strconv.AppendUint(b, m.SpecRevision, 10)
	}
	b = append(b, `,"document":`...)
	b = doc.AppendJSON(b)
	return append(b, '}')
}

// kept is plan name's latest revision as kept, if it is revision rev
// (nil: none kept, or another; found is the revision kept, 0 for none).
func (k *marks) kept(name string, rev int) (sp *store.StoredPlan, found int, err error) {
	path := k.placementPath(name)
	if path == "" {
		return nil, 0, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("kept plan %s: %w", name, err)
	}
	var f keptPlan
	var doc plan.Document
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, 0, fmt.Errorf("kept plan %s: %w", path, err)
	}
	if err := json.Unmarshal(f.Document, &doc); err != nil {
		return nil, 0, fmt.Errorf("kept plan %s: %w", path, err)
	}
	if doc.Name != name || doc.Revision != rev {
		return nil, doc.Revision, nil
	}
	return &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{Base: rev, SpecDigest: f.SpecDigest, PlacedFor: f.PlacedFor, SpecRevision: f.SpecRevision}}, rev, nil
}

// lostPlacement says that plan s's placement of revision mark is lost
// with the plan history and nothing here kept it (found: the revision
// the state file keeps, 0 for none; err, why it could not be read): a
// problem naming the plan, for as long as this planner runs, since its
// workers may move.
func (p *loopState) lostPlacement(s *planState, mark, found int, err error) {
	why := fmt.Sprintf("none was kept beside the state file %s (a plan of more than %d workers is not kept)", p.marks.path, p.marks.maxWorkers)
	switch {
	case err != nil:
		why = fmt.Sprintf("the one kept cannot be read: %v", err)
	case found > 0:
		why = fmt.Sprintf("the state file %s keeps revision %d's, not its", p.marks.path, found)
	}
	msg := fmt.Sprintf("plan %s: its placement of revision %d was lost with the plan history, and %s: it is planned afresh on the inventory as the nodes report, and its workers may move", s.name, mark, why)
	s.log.Error().Int("high_water", mark).Msg(msg)
	p.problem("lost:"+s.name, msg)
}

// keepPlacement keeps sp, plan s's new latest, logging a failure once
// per cause as mark does.
func (p *Service) keepPlacement(s *planState, sp *store.StoredPlan) {
	err := p.marks.keep(s.name, sp)
	k := p.marks
	k.mu.Lock()
	said := k.keepErr != nil && err != nil && k.keepErr.Error() == err.Error()
	k.keepErr = err
	k.mu.Unlock()
	if err != nil && !said {
		s.log.Error().Err(err).Msg("cannot keep the plan's latest revision: should the store be wiped, the plan would be planned afresh")
	}
}
