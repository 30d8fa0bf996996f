package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// goldenDocs are the documents whose encodings testdata/golden-*.json
// hold as the encoder before Status was the one source wrote them.
func goldenDocs() map[string]Document {
	at := time.Date(2026, 12, 1, 10, 0, 0, 5, time.UTC)
	workers := NewWorkers([]Worker{{Component: Train, Index: 0, Pool: "p0", NodeID: "n1", IP: "10.0.0.1", GPUs: []int{0}, GPUUUIDs: []string{"GPU-a"}, GPUShare: 1, CPUs: 1}})
	place := Placement{ResourcePool: []PoolExport{}, Pools: []Pool{{Name: "p0", Nodes: NewPoolNodes([]PoolNode{{NodeID: "n1", IP: "10.0.0.1", TotalGPUs: 8, TotalCPUs: 64, Allocations: map[Component][]Range{Train: {{First: 0, Last: 0}}}}})}}, Workers: workers, StorageToTrainWorkers: map[string][]int{}}
	none := Placement{ResourcePool: []PoolExport{}, Pools: []Pool{}, StorageToTrainWorkers: map[string][]int{}}
	docs := map[string]Document{
		"valid": {Header: Header{Name: "a", Revision: 3, CreatedAt: at, Reason: "grew", Mode: "auto", Strategy: "disaggregate", EnvStrategy: "default",
			Moved: 1, Demands: []Demand{{Component: Train, Workers: 1, NumGPUs: 1, NumCPUs: 1}}, Priority: 5, GPUsHeld: 1, PreemptedBy: []string{"z"},
			Status: Status{State: StateValid, Fresh: FreshFirst}}, Placement: place},
		"degraded": {Header: Header{Name: "a", Revision: 4, CreatedAt: at, Reason: "node left n2", Mode: "auto", Error: "1 worker unplaced: no room",
			Unplaced: []Unplaced{{Component: Train, Index: 1, Reason: "node left n2", NodeID: "n2", GPUs: []int{3}}}, PendingSpec: &PendingSpec{Reason: "waits"},
			Status: Status{State: StateDegraded, Reason: ReasonWaiting, By: []string{"b", "c"}, Cause: "no room"}}, Placement: place},
		"preempted": {Header: Header{Name: "q", Revision: 9, CreatedAt: at, Error: "preempted by plan z (priority 9): no room", PreemptedBy: []string{"z"},
			Status: Status{State: StateInvalid, Reason: ReasonPreempted, By: []string{"z"}, Cause: "no room"}}, Placement: none},
		"removed": {Header: Header{Name: "r", Revision: 2, CreatedAt: at, Error: "spec removed (planner spec rm): workers released",
			Status: Status{State: StateInvalid, Reason: ReasonRemoved}}, Placement: none},
	}
	gpu := 3
	drained := docs["degraded"]
	drained.Status.Reason, drained.Status.By = ReasonDrained, nil
	drained.Status.Drained = []Drain{{NodeID: "n2", GPU: &gpu, Cause: DrainOperator, Reason: "maintenance"}}
	drained.Status.Resized = []Resize{{Component: Eval, From: 4, To: 2}}
	docs["drained"] = drained
	return docs
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// TestEncodingIsAsBefore: documents and events are written byte for byte
// as before Status was the one source of a plan's state (valid, state
// and removed derived from it), by encoding/json and by AppendJSON, and
// read back to what was written. A drained or resized status, which
// AppendJSON used to leave out, is written as encoding/json wrote it.
func TestEncodingIsAsBefore(t *testing.T) {
	for name, d := range goldenDocs() {
		t.Run(name, func(t *testing.T) {
			want := readFixture(t, "golden-"+name+".json")
			if got, _ := json.Marshal(d); !bytes.Equal(got, want) {
				t.Errorf("json.Marshal:\n got %s\nwant %s", got, want)
			}
			if got := d.AppendJSON(nil); !bytes.Equal(got, want) {
				t.Errorf("AppendJSON:\n got %s\nwant %s", got, want)
			}
			if name != "drained" {
				ev := Event{Header: d.Header, Base: d.Revision, Placement: &d.Placement}
				if got, _ := json.Marshal(ev); !bytes.Equal(got, readFixture(t, "golden-"+name+".event.json")) {
					t.Errorf("event:\n got %s\nwant %s", got, readFixture(t, "golden-"+name+".event.json"))
				}
			}
			var back Document
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Header, d.Header) {
				t.Errorf("read back:\n got %+v\nwant %+v", back.Header, d.Header)
			}
			if back.Workers.Len() != d.Workers.Len() || len(back.Pools) != len(d.Pools) {
				t.Errorf("read back %d workers, %d pools; want %d, %d", back.Workers.Len(), len(back.Pools), d.Workers.Len(), len(d.Pools))
			}
		})
	}
	ch := Event{Header: goldenDocs()["degraded"].Header, Base: 2, Change: &Change{Nodes: []NodeChange{{NodeID: "n1"}}}}
	want := readFixture(t, "golden-change.event.json")
	if got, _ := json.Marshal(ch); !bytes.Equal(got, want) {
		t.Errorf("change event:\n got %s\nwant %s", got, want)
	}
	var back Event
	if err := json.Unmarshal(want, &back); err != nil {
		t.Fatal(err)
	}
	if back.Placement != nil || back.Change == nil || back.Kind() != "change" || !reflect.DeepEqual(back.Header, ch.Header) {
		t.Errorf("change event read back as %+v", back)
	}
}

// TestOldDocumentsDecode: a document written before Status (valid,
// state, removed and preempted_by say the state) or before states (valid
// alone) reads with the Status they say, and is written again with it.
func TestOldDocumentsDecode(t *testing.T) {
	for _, c := range []struct {
		file string
		want Status
	}{
		{"old-prestates-valid.json", Status{State: StateValid}},
		{"old-prestates-invalid.json", Status{State: StateInvalid}},
		{"old-prestatus-degraded.json", Status{State: StateDegraded}},
		{"old-prestatus-removed.json", Status{State: StateInvalid, Reason: ReasonRemoved}},
		{"old-prestatus-removed-degraded.json", Status{State: StateInvalid, Reason: ReasonRemoved}},
		{"old-prestatus-preempted.json", Status{State: StateInvalid, Reason: ReasonPreempted, By: []string{"z"}}},
		// Preempted_by on a valid plan is what took GPUs it held; its
		// state is valid all the same.
		{"old-prestatus-valid-preempted.json", Status{State: StateValid}},
	} {
		t.Run(c.file, func(t *testing.T) {
			raw := readFixture(t, c.file)
			var d Document
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.Status, c.want) {
				t.Errorf("status %+v, want %+v", d.Status, c.want)
			}
			var ev Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ev.Status, c.want) || ev.Placement == nil || ev.Placement.Workers.Len() != d.Workers.Len() {
				t.Errorf("as an event: status %+v, placement %v", ev.Status, ev.Placement != nil)
			}
			var w map[string]any
			if err := json.Unmarshal(d.AppendJSON(nil), &w); err != nil {
				t.Fatal(err)
			}
			if w["valid"] != (c.want.State == StateValid) || w["state"] != string(c.want.State) || (w["removed"] == true) != (c.want.Reason == ReasonRemoved) {
				t.Errorf("written again: valid %v state %v removed %v, want status %+v", w["valid"], w["state"], w["removed"], c.want)
			}
		})
	}
}

// Every State, and every Reason a planner writes.
var (
	states  = []State{StateValid, StateDegraded, StateInvalid}
	reasons = []Reason{ReasonSpec, ReasonQuota, ReasonPreempted, ReasonWaiting, ReasonRemoved, ReasonDrained, ReasonShrunk, ReasonGrew}
)

// TestStatusRoundTrip: every state and reason, with what a status may
// carry, is written with valid, state and removed derived from it, and
// read back to itself, by either encoder; AppendJSON writes what
// encoding/json writes.
func TestStatusRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		st := Status{State: rapid.SampledFrom(states).Draw(t, "state")}
		if rapid.Bool().Draw(t, "reason") {
			st.Reason = rapid.SampledFrom(reasons).Draw(t, "kind")
		}
		st.By = rapid.SliceOfN(rapid.StringMatching(`[a-z"é]{1,4}`), 0, 3).Draw(t, "by")
		if len(st.By) == 0 {
			st.By = nil
		}
		st.Cause = rapid.String().Draw(t, "cause")
		st.Fresh = rapid.SampledFrom([]string{"", FreshFirst, FreshQuota}).Draw(t, "fresh")
		if rapid.Bool().Draw(t, "resized") {
			st.Resized = []Resize{{Component: Env, Group: rapid.IntRange(0, 3).Draw(t, "group"), From: 1, To: 2}}
		}
		if rapid.Bool().Draw(t, "drained") {
			st.Drained = []Drain{{NodeID: "n1", Cause: DrainFlapping}}
		}
		if rapid.Bool().Draw(t, "leaving") {
			st.Leaving = []Drain{{NodeID: "n2", Cause: DrainOperator, Reason: rapid.String().Draw(t, "why")}}
		}
		d := Document{Header: Header{Name: "p", Revision: 1, CreatedAt: time.Unix(0, 0).UTC(), Status: st}}
		if rapid.Bool().Draw(t, "preempted_by") {
			d.PreemptedBy = []string{"z"}
		}
		for name, enc := range map[string]func() []byte{
			"encoding/json": func() []byte { b, _ := json.Marshal(d); return b },
			"AppendJSON":    func() []byte { return d.AppendJSON(nil) },
		} {
			b := enc()
			var w struct {
				Valid   bool  `json:"valid"`
				State   State `json:"state"`
				Removed bool  `json:"removed"`
			}
			if err := json.Unmarshal(b, &w); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if w.Valid != (st.State == StateValid) || w.State != st.State || w.Removed != (st.Reason == ReasonRemoved) {
				t.Fatalf("%s: valid %v state %q removed %v for status %+v", name, w.Valid, w.State, w.Removed, st)
			}
			var back Document
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !reflect.DeepEqual(back.Status, st) {
				t.Fatalf("%s: read back %+v, want %+v", name, back.Status, st)
			}
		}
		// As far as a reader can tell: AppendJSON leaves <, > and &
		// unescaped, which encoding/json escapes for HTML.
		var a, b any
		ja, _ := json.Marshal(d)
		_ = json.Unmarshal(ja, &a)
		_ = json.Unmarshal(d.AppendJSON(nil), &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("AppendJSON differs from encoding/json:\n%s\n%s", d.AppendJSON(nil), ja)
		}
	})
}

// TestUnknownStateIsInvalid: a header that says no state (one built in
// code, not by a planner), or one not known (another program's), places
// nothing, and is written as invalid.
func TestUnknownStateIsInvalid(t *testing.T) {
	for _, st := range []State{"", "bogus"} {
		h := Header{Status: Status{State: st}}
		if h.PlanState() != StateInvalid || h.Valid() || h.Placed() || h.Removed() {
			t.Fatalf("state %q: reads %q valid %v placed %v removed %v", st, h.PlanState(), h.Valid(), h.Placed(), h.Removed())
		}
		var back Header
		b, _ := json.Marshal(h)
		if err := json.Unmarshal(b, &back); err != nil || back.Status.State != StateInvalid || !strings.Contains(string(b), `"valid":false,"error":"","state":"invalid"`) {
			t.Fatalf("state %q read back: %+v %v from %s", st, back.Status, err, b)
		}
	}
	var d Document
	if err := json.Unmarshal([]byte(`{"valid":false,"state":"degraded","status":{"state":"bogus"}}`), &d); err != nil || d.Placed() {
		t.Fatalf("status.state bogus: placed %v, %v", d.Placed(), err)
	}
}

// TestHeaderJSONHasEveryField keeps headerJSON, the header as documents
// carry it, in step with Header: each field of Header but Status is
// there under its name and JSON key, in Header's order, and the only
// others are what is derived from Status.
func TestHeaderJSONHasEveryField(t *testing.T) {
	h, w := reflect.TypeFor[Header](), reflect.TypeFor[headerJSON]()
	derived := map[string]bool{"Valid": true, "State": true, "Removed": true}
	var fromH, fromW []string
	for f := range h.Fields() {
		if f.Name != "Status" {
			fromH = append(fromH, f.Name+" "+string(f.Tag))
		}
	}
	for f := range w.Fields() {
		if !derived[f.Name] && f.Name != "Status" {
			fromW = append(fromW, f.Name+" "+string(f.Tag))
		}
	}
	if !reflect.DeepEqual(fromH, fromW) {
		t.Fatalf("Header's fields\n %v\nheaderJSON's\n %v", fromH, fromW)
	}
	if f, ok := w.FieldByName("Status"); !ok || f.Type != reflect.TypeFor[*Status]() {
		t.Fatalf("headerJSON.Status is %v, want *Status (absent in older documents)", f.Type)
	}
}
