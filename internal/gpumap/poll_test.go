package gpumap

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// movingSource is a Source whose plan a test replaces.
type movingSource struct {
	mu   sync.Mutex
	plan *planner.Plan
	docs []inventory.NodeInventory
}

func (m *movingSource) Plans() []*planner.Plan {
	m.mu.Lock()
	defer m.mu.Unlock()
	return []*planner.Plan{m.plan}
}

func (m *movingSource) Inventory() []inventory.NodeInventory { return m.docs }

// TestRedrawWithoutCue: a revision the source holds whose cue never came
// (lost in a flood, or a stream an older planner rewrote without
// RePublish) still reaches the pages within seconds: the map compares
// the source with what it announced every second.
func TestRedrawWithoutCue(t *testing.T) {
	docs, p := cluster(t, 4)
	src := &movingSource{plan: p, docs: docs}
	s := NewServer(src, zerolog.Nop())
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Serve(ctx, l, natstest.Start(t).Conn(t)); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.Addr().String()+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if first := <-lines; !strings.HasPrefix(first, ":") {
		t.Fatalf("stream opened with %q", first)
	}
	next := *p
	next.Revision = p.Revision + 1
	src.mu.Lock()
	src.plan = &next
	src.mu.Unlock()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the event stream ended")
			}
			if strings.HasPrefix(line, "data:") && strings.Contains(line, `"revision":`) {
				return
			}
		case <-timeout:
			t.Fatal("no revision event within 10s for a revision the source holds uncued")
		}
	}
}
