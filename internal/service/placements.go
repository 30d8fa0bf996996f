package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// revision costs what encoding it does (about 150 bytes a worker); a
// larger plan resumes from its revision number only.
const maxKeptWorkers = 100_000

// keptPlan is one kept plan's file.
type keptPlan struct {
	SpecDigest string          `json:"spec_digest,omitempty"`
	Document   json.RawMessage `json:"document"`
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
	if sp.Plan.Workers.Len() > maxKeptWorkers {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kept plan %s: %w", name, err)
		}
		return nil
	}
	doc, err := json.Marshal(&sp.Plan.Document)
	if err != nil {
		return fmt.Errorf("kept plan %s: %w", name, err)
	}
	data, _ := json.Marshal(keptPlan{SpecDigest: sp.SpecDigest, Document: doc})
	tmp := path + ".tmp"
	err = os.MkdirAll(filepath.Dir(path), 0o700)
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

// kept is plan name's latest revision as kept, if it is revision rev
// (nil: none kept, or another).
func (k *marks) kept(name string, rev int) (*store.StoredPlan, error) {
	path := k.placementPath(name)
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kept plan %s: %w", name, err)
	}
	var f keptPlan
	var doc plan.Document
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("kept plan %s: %w", path, err)
	}
	if err := json.Unmarshal(f.Document, &doc); err != nil {
		return nil, fmt.Errorf("kept plan %s: %w", path, err)
	}
	if doc.Name != name || doc.Revision != rev {
		return nil, nil
	}
	return &store.StoredPlan{Plan: &planner.Plan{Document: doc}, Meta: client.Meta{Base: rev, SpecDigest: f.SpecDigest}}, nil
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
