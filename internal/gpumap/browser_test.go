package gpumap_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/poolplanner/poolplanner/internal/cli"
	"github.com/poolplanner/poolplanner/internal/gpumap"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func planner(t *testing.T, args ...string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := cli.Main(context.Background(), args, nil, &out, &errOut); code != 0 {
		t.Fatalf("planner %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
}

// TestGPUMapInBrowser runs planner serve with the map on 40 simulated
// nodes and looks at it in headless Chromium: the plan on top, the nodes
// folded into a few rows of 8 GPU cells, a click showing a GPU's worker;
// a second plan stored, the page redraws by itself with it. It saves a
// screenshot (POOLPLANNER_SCREENSHOT=FILE to keep it, as docs/gpu-map.png
// is made).
func TestGPUMapInBrowser(t *testing.T) {
	exe := gpumap.Browser(t)
	natsAddr, httpAddr := freeAddr(t), freeAddr(t)
	server := "nats://" + natsAddr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var serveErr bytes.Buffer
	go func() {
		done <- cli.Main(ctx, []string{"serve", "--listen", natsAddr, "--data-dir", t.TempDir(),
			"--spec", "../../examples/disaggregate.yaml", "--simulate", "40x8xH100", "--no-local-reporter",
			"--debounce", "50ms", "--log-level", "warn", "--http-listen", httpAddr}, nil, &bytes.Buffer{}, &serveErr)
	}()
	t.Cleanup(func() { cancel(); <-done })

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 40*time.Second)
	defer tcancel()

	page := gpumap.Page{T: t, Ctx: bctx, Serve: &serveErr}
	page.Do(chromedp.Navigate("http://" + httpAddr + "/"))
	page.Wait(`#plans tr[data-plan="default"]`)
	state := page.Text(`#plans tr[data-plan="default"] [data-role="state"]`)
	rows := page.Count(`#rows .row`)
	folded := page.Count(`#rows .row.folded`)
	cells := page.Count(`#rows .cell`)
	// 40 nodes: the train nodes, the eval nodes, the env nodes and the
	// idle rest fold into a handful of rows, 8 cells each.
	if state != "valid" || rows == 0 || rows > 8 || folded == 0 || cells != 8*rows {
		t.Fatalf("drawn: state %q, %d rows (%d folded), %d cells", state, rows, folded, cells)
	}
	if held := page.Attr(`#rows .row .cell[data-gpu="0"]`, "data-held"); !strings.HasPrefix(held, "default:train:1") {
		t.Fatalf("the first row's GPU 0 holds %q, want default's train", held)
	}

	// A click shows the worker on the GPU and why it is there.
	page.Click(`#rows .row .cell[data-gpu="0"]`)
	page.Wait(`#detail .worker`)
	if detail := page.Text(`#detail`); !strings.Contains(detail, "default: train 0") || !strings.Contains(detail, "in pool train_pool") {
		t.Fatalf("click shows %q", detail)
	}

	// A new plan: the page redraws by itself.
	before := page.Attr(`body`, "data-drawn")
	planner(t, "spec", "set", "--plan", "exp", "../../examples/experiment.yaml", "--server", server)
	page.Wait(`#plans tr[data-plan="exp"]`)
	expState := page.Text(`#plans tr[data-plan="exp"] [data-role="state"]`)
	after := page.Attr(`body`, "data-drawn")
	if n := page.Count(`#rows .cell[data-held^="exp:"]`); expState != "valid" || after == before || n == 0 {
		t.Fatalf("redraw: exp %q, drawn %s then %s, %d exp cells", expState, before, after, n)
	}
	page.Click(`#detail .close`)
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(t.TempDir(), "gpu-map.png")
	if keep := os.Getenv("POOLPLANNER_SCREENSHOT"); keep != "" {
		shot = keep
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%s bytes)", shot, strconv.Itoa(len(png)))
}
