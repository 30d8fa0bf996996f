package plan

import (
	"encoding/json"
	"time"
)

// headerJSON is a header as documents carry it: Status, and what older
// readers read instead of it (valid, state, removed), derived from it.
// Its fields are Header's, in the order documents have always had them;
// TestHeaderJSONHasEveryField keeps the two in step.
type headerJSON struct {
	Name         string        `json:"name"`
	Revision     int           `json:"revision"`
	CreatedAt    time.Time     `json:"created_at"`
	Reason       string        `json:"reason"`
	Mode         string        `json:"mode"`
	Strategy     string        `json:"strategy"`
	EnvStrategy  string        `json:"env_strategy"`
	Valid        bool          `json:"valid"`
	Error        string        `json:"error"`
	State        State         `json:"state"`
	Unplaced     []Unplaced    `json:"unplaced,omitempty"`
	PendingSpec  *PendingSpec  `json:"pending_spec,omitempty"`
	Moved        int           `json:"moved"`
	Warnings     []string      `json:"warnings,omitempty"`
	Demands      []Demand      `json:"demands"`
	Capacity     Capacity      `json:"capacity"`
	Explanations []Explanation `json:"explanations,omitempty"`
	Priority     int           `json:"priority"`
	GPUsHeld     int           `json:"gpus_held"`
	PreemptedBy  []string      `json:"preempted_by,omitempty"`
	Removed      bool          `json:"removed,omitempty"`
	// Status is nil in a document from before it.
	Status *Status `json:"status,omitempty"`
}

// wire is h as documents carry it.
func (h *Header) wire() headerJSON {
	st := h.Status
	st.State = h.PlanState()
	return headerJSON{
		Name: h.Name, Revision: h.Revision, CreatedAt: h.CreatedAt, Reason: h.Reason,
		Mode: h.Mode, Strategy: h.Strategy, EnvStrategy: h.EnvStrategy,
		Valid: h.Valid(), Error: h.Error, State: st.State,
		Unplaced: h.Unplaced, PendingSpec: h.PendingSpec, Moved: h.Moved, Warnings: h.Warnings,
		Demands: h.Demands, Capacity: h.Capacity, Explanations: h.Explanations,
		Priority: h.Priority, GPUsHeld: h.GPUsHeld, PreemptedBy: h.PreemptedBy,
		Removed: h.Removed(), Status: &st,
	}
}

// header is the header w carries. A document from before Status says
// its state with valid, state, removed and preempted_by: Status is what
// they say (Reason empty where they do not say it). A document from
// before states has valid only.
func (w *headerJSON) header() Header {
	h := Header{
		Name: w.Name, Revision: w.Revision, CreatedAt: w.CreatedAt, Reason: w.Reason,
		Mode: w.Mode, Strategy: w.Strategy, EnvStrategy: w.EnvStrategy, Error: w.Error,
		Unplaced: w.Unplaced, PendingSpec: w.PendingSpec, Moved: w.Moved, Warnings: w.Warnings,
		Demands: w.Demands, Capacity: w.Capacity, Explanations: w.Explanations,
		Priority: w.Priority, GPUsHeld: w.GPUsHeld, PreemptedBy: w.PreemptedBy,
	}
	if w.Status != nil {
		h.Status = *w.Status
	}
	if h.Status.State != "" {
		return h
	}
	switch {
	case w.Valid:
		h.Status.State = StateValid
	case w.State == StateDegraded && !w.Removed:
		h.Status.State = StateDegraded
	default:
		h.Status.State = StateInvalid
	}
	switch {
	case w.Status != nil:
		// A status without a state: its reason stands.
	case w.Removed:
		h.Status.Reason = ReasonRemoved
	case h.Status.State != StateValid && len(w.PreemptedBy) > 0:
		h.Status.Reason, h.Status.By = ReasonPreempted, w.PreemptedBy
	}
	return h
}

// MarshalJSON writes the header with valid, state and removed derived
// from Status.
func (h Header) MarshalJSON() ([]byte, error) { return json.Marshal(h.wire()) }

// UnmarshalJSON reads a header of any version (see headerJSON.header).
func (h *Header) UnmarshalJSON(b []byte) error {
	var w headerJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*h = w.header()
	return nil
}

// documentJSON is a document as encoding/json reads and writes it: the
// header's wire form, then the placement.
type documentJSON struct {
	headerJSON
	*Placement
}

// MarshalJSON writes the document as AppendJSON does, through
// encoding/json (its reference).
func (d Document) MarshalJSON() ([]byte, error) {
	return json.Marshal(documentJSON{headerJSON: d.Header.wire(), Placement: &d.Placement})
}

// UnmarshalJSON reads a document of any version (see Header).
func (d *Document) UnmarshalJSON(b []byte) error {
	w := documentJSON{Placement: &d.Placement}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	d.Header = w.header()
	return nil
}

// eventJSON is an event as its subject carries it.
type eventJSON struct {
	headerJSON
	Base     int    `json:"base"`
	Snapshot string `json:"snapshot,omitempty"`
	*Placement
	Change *Change `json:"change,omitempty"`
}

// MarshalJSON writes the event with its header's wire form.
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(eventJSON{headerJSON: e.Header.wire(), Base: e.Base, Snapshot: e.Snapshot, Placement: e.Placement, Change: e.Change})
}

// UnmarshalJSON reads an event of any version (see Header).
func (e *Event) UnmarshalJSON(b []byte) error {
	var w eventJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = Event{Header: w.header(), Base: w.Base, Snapshot: w.Snapshot, Placement: w.Placement, Change: w.Change}
	return nil
}
