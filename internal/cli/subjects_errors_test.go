package cli

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSubjectsErrorReplies: every error reply subjects.md shows for a
// `nats req` (its code and message) is what the service answers today,
// on the setup it names (the quick start's spec on four simulated
// nodes, revision 1); those it shows for a later state ("while ...")
// aside.
func TestSubjectsErrorReplies(t *testing.T) {
	data, err := os.ReadFile("../../subjects.md")
	if err != nil {
		t.Fatal(err)
	}
	example := regexp.MustCompile(`(?m)^    \$ nats req (\S+) '([^']*)'(.*)\n    \.\.\. Nats-Service-Error-Code: (\d+)\n    (\{.*\})$`)
	matches := example.FindAllStringSubmatch(string(data), -1)
	if len(matches) < 5 {
		t.Fatalf("found %d error examples in subjects.md; the pattern no longer reads them", len(matches))
	}
	server, serveErr := startQuickServe(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	runUntil(t, 30*time.Second, succeeds, "lookup", "train", "0", "--server", server)
	nc := dialRetry(t, server)
	for _, m := range matches {
		subject, body, comment, code, reply := m[1], m[2], m[3], m[4], m[5]
		if strings.Contains(comment, "while") {
			continue // another state than the quick start's first plan
		}
		var want struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(reply), &want); err != nil {
			t.Errorf("subjects.md reply %s: %v", reply, err)
			continue
		}
		msg, err := nc.Request(subject, []byte(body), 5*time.Second)
		if err != nil {
			t.Errorf("%s %s: %v", subject, body, err)
			continue
		}
		var got struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(msg.Data, &got)
		if gotCode := msg.Header.Get("Nats-Service-Error-Code"); gotCode != code || got.Error != want.Error {
			t.Errorf("%s %s:\n got %s %q\nwant %s %q (subjects.md)", subject, body, gotCode, got.Error, code, want.Error)
		}
	}
}
