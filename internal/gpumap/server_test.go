package gpumap

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/planner"
)

func TestHandler(t *testing.T) {
	docs, p := cluster(t, 4)
	srv := httptest.NewServer(NewServer(fixedSource{[]*planner.Plan{p}, docs}, zerolog.Nop()).Handler())
	defer srv.Close()
	w := p.Workers.At(0)
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/", 200, "poolplanner GPU map"},
		{"/api/map", 200, `"name":"big"`},
		{"/api/gpu?node=" + w.NodeID + "&gpu=0", 200, `"component":"train"`},
		{"/api/gpu?node=" + w.NodeID + "&gpu=x", 400, "want ?node=NODE_ID&gpu=INDEX"},
		{"/api/gpu?gpu=0", 400, "want ?node="},
		{"/api/gpu?node=nope&gpu=0", 404, `node "nope" is not in the inventory`},
		{"/api/gpu?node=" + w.NodeID + "&gpu=99", 404, "has no GPU 99"},
		{"/nothing", 404, ""},
	} {
		resp, err := http.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %q; want %d with %q", c.path, resp.StatusCode, body, c.code, c.want)
		}
	}
	var m Map
	resp, err := http.Get(srv.URL + "/api/map")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || m.Nodes != 4 || len(m.Plans) != 1 {
		t.Fatalf("map: %+v, %v", m, err)
	}
}
