package client

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/poolplanner/poolplanner/plan"
)

// TestValidateReplyJSON: a validate reply is its document's fields and
// nodes, and reads back to both (the document encodes itself, which an
// embedding type would otherwise take over whole).
func TestValidateReplyJSON(t *testing.T) {
	doc := &plan.Document{Header: plan.Header{Name: "q", Error: "waits", Status: plan.Status{State: plan.StateInvalid, Reason: plan.ReasonWaiting, By: []string{"a"}}}}
	for _, c := range []struct {
		name string
		in   ValidateReply
		want string
	}{
		{"document", ValidateReply{Document: doc, Nodes: 7}, `"nodes":7}`},
		{"none", ValidateReply{Nodes: 2}, `{"nodes":2}`},
	} {
		b, err := json.Marshal(c.in)
		if err != nil || !json.Valid(b) || !strings.HasSuffix(string(b), c.want) {
			t.Fatalf("%s: %s %v, want it to end %s", c.name, b, err, c.want)
		}
		var back ValidateReply
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.Nodes != c.in.Nodes || c.in.Document != nil && (back.Name != "q" || back.Status.Reason != plan.ReasonWaiting || back.Valid()) {
			t.Errorf("%s: read back %+v", c.name, back)
		}
	}
}
