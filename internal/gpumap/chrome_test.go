package gpumap

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/natstest"
	"github.com/poolplanner/poolplanner/internal/planner"
)

// Browser finds Chromium (or Chrome); none is a skip, unless
// POOLPLANNER_REQUIRE_BROWSER is set (CI installs Chromium and sets it).
func Browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("POOLPLANNER_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium in PATH (POOLPLANNER_REQUIRE_BROWSER is set)")
	}
	t.Skip("no Chromium in PATH: the GPU map's browser test needs one (apt-get install chromium)")
	return ""
}

// Page drives a browser tab, failing the test on an error; Serve, when
// set, is the log of the server under test, shown with failures.
type Page struct {
	T     *testing.T
	Ctx   context.Context
	Serve *bytes.Buffer
}

func (c Page) log() string {
	if c.Serve == nil {
		return ""
	}
	return c.Serve.String()
}

func (c Page) Do(steps ...chromedp.Action[chromedp.Void]) {
	c.T.Helper()
	if err := chromedp.Do(c.Ctx, steps...); err != nil {
		c.T.Fatalf("browser: %v (serve: %s)", err, c.log())
	}
}

// js evaluates expr in the page (the DOM as the page's script sees it:
// chromedp's own queries do not follow nodes the script adds).
func js[T any](c Page, expr string) T {
	c.T.Helper()
	v, err := chromedp.Run(c.Ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		c.T.Fatalf("browser: %s: %v (serve: %s)", expr, err, c.log())
	}
	return v
}

// Wait waits for an element matching sel, failing on a script error.
func (c Page) Wait(sel string) {
	c.T.Helper()
	for {
		state := js[string](c, fmt.Sprintf(`document.querySelector(%q) ? "" : (document.body.dataset.error || "-")`, sel))
		switch state {
		case "":
			return
		case "-":
		default:
			c.T.Fatalf("the page failed: %s", state)
		}
		select {
		case <-c.Ctx.Done():
			c.T.Fatalf("no %s on the page (serve: %s)", sel, c.log())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c Page) Click(sel string) {
	c.T.Helper()
	js[bool](c, fmt.Sprintf(`(document.querySelector(%q).click(), true)`, sel))
}

func (c Page) Text(sel string) string {
	c.T.Helper()
	return js[string](c, fmt.Sprintf(`document.querySelector(%q).innerText`, sel))
}

func (c Page) Attr(sel, name string) string {
	c.T.Helper()
	return js[string](c, fmt.Sprintf(`document.querySelector(%q).getAttribute(%q) || ""`, sel, name))
}

func (c Page) Count(sel string) int {
	c.T.Helper()
	return js[int](c, fmt.Sprintf("document.querySelectorAll(%q).length", sel))
}

// NewTab starts Chromium at exe and returns a tab's context.
func NewTab(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	t.Cleanup(func() { cancel(); bcancel(); acancel() })
	return ctx
}

// fixedSource is a Source of fixed plans and inventory.
type fixedSource struct {
	plans []*planner.Plan
	docs  []inventory.NodeInventory
}

func (f fixedSource) Plans() []*planner.Plan               { return f.plans }
func (f fixedSource) Inventory() []inventory.NodeInventory { return f.docs }

// TestMapAtScale: 20,000 nodes, a few hundred of them distinct (an
// unhealthy GPU on every 97th), and every node distinct in a second
// map: the page draws rows a chunk at a time, never a DOM node per GPU
// of the whole cluster, and draws more as it scrolls.
func TestMapAtScale(t *testing.T) {
	exe := Browser(t)
	docs, p := cluster(t, 20000)
	for _, c := range []struct {
		name string
		docs []inventory.NodeInventory
	}{{"folded", docs}, {"distinct", distinct(docs)}} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(NewServer(fixedSource{[]*planner.Plan{p}, c.docs}, zerolog.Nop()).Handler())
			t.Cleanup(srv.Close) // after the tab's, which holds an event stream
			page := Page{T: t, Ctx: NewTab(t, exe)}
			start := time.Now()
			page.Do(chromedp.Navigate(srv.URL + "/"))
			page.Wait(`#plans tr[data-plan="big"]`)
			page.Wait(`#rows .row`)
			took := time.Since(start)
			rows, cells := page.Count(`#rows .row`), page.Count(`#rows .cell`)
			total := js[int](page, `(() => { const r = [...document.querySelectorAll("#rows .row")]; return r.reduce((s, x) => s + Number(x.dataset.count), 0) })()`)
			t.Logf("%s: drawn in %s: %d rows (%d nodes), %d cells", c.name, took.Round(time.Millisecond), rows, total, cells)
			if rows > 1200 || cells != 8*rows {
				t.Fatalf("%d rows, %d cells drawn at once", rows, cells)
			}
			// Scrolling to the end draws more, a chunk at a time: the
			// folded map whole, the distinct one a chunk further.
			want := js[int](page, `map.rows.length`)
			if c.name == "distinct" {
				want = rows + 400
			}
			natstest.WaitEvery(t, 45*time.Second, 50*time.Millisecond, fmt.Sprintf("scrolling to the end drawing %d rows", want), func() bool {
				if page.Count(`#rows .row`) >= want {
					return true
				}
				js[bool](page, `(window.scrollTo(0, document.body.scrollHeight), true)`)
				return false
			})
			total = js[int](page, `(() => { const r = [...document.querySelectorAll("#rows .row")]; return r.reduce((s, x) => s + Number(x.dataset.count), 0) })()`)
			if c.name == "folded" && total != 20000 {
				t.Fatalf("the rows hold %d nodes", total)
			}
		})
	}
}

// distinct gives every node a GPU count of its own pattern, so that no
// two neighbours fold.
func distinct(docs []inventory.NodeInventory) []inventory.NodeInventory {
	out := make([]inventory.NodeInventory, len(docs))
	for i, d := range docs {
		d.GPUs = slices.Clone(d.GPUs)
		for g := range d.GPUs {
			d.GPUs[g].Healthy = (i>>g)&1 == 0
		}
		out[i] = d
	}
	return out
}
