package gpumap

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/plan"
)

//go:embed page.html
var page []byte

// Server serves the map of a Source over HTTP.
type Server struct {
	// Limits bound what the map's clients may hold; set before Serve.
	Limits Limits
	src    Source
	log    zerolog.Logger
	mu     sync.Mutex
	// clients are the open event streams, each cued with the revisions
	// to announce; done ends them (the server stopping).
	clients map[chan Revision]struct{}
	done    chan struct{}
	// waiting is, per plan with an announcement under way, the newest
	// revision to announce: one goroutine per plan, however many
	// revisions arrive meanwhile.
	waiting map[string]int
}

// Revision is what an event announces: a plan's new revision.
type Revision struct {
	Plan     string `json:"plan"`
	Revision int    `json:"revision"`
}

// Limits bound the map's HTTP clients. The map shares the process's
// file descriptors with the embedded NATS server, so idle or slow
// clients must not hold them: each connection is closed when idle or
// too slow, and at most MaxConns are open at once.
type Limits struct {
	// MaxConns is how many connections are open at once; more wait in
	// the kernel's listen backlog, holding no descriptor of the
	// process, until one closes. Each open page holds one (its event
	// stream).
	MaxConns int
	// ReadHeader bounds reading a request's header, Read the whole
	// request; Idle is how long a keep-alive connection may wait for
	// its next request; Write bounds a response, and each write to an
	// event stream (a page that stops reading is dropped).
	ReadHeader, Read, Idle, Write time.Duration
}

// DefaultLimits are the map's limits unless set otherwise.
func DefaultLimits() Limits {
	return Limits{MaxConns: 128, ReadHeader: 5 * time.Second, Read: 10 * time.Second, Idle: time.Minute, Write: 10 * time.Second}
}

// NewServer returns a map server of src, with DefaultLimits.
func NewServer(src Source, log zerolog.Logger) *Server {
	return &Server{Limits: DefaultLimits(), src: src, log: log, clients: map[chan Revision]struct{}{}, done: make(chan struct{}), waiting: map[string]int{}}
}

// Listen listens on addr for Serve: at start, so that a taken port is
// an error before anything else runs.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-listen %s: %w", addr, err)
	}
	return l, nil
}

// cuePendingMsgs and cuePendingBytes bound what a cue subscription
// queues: cues are a few hundred bytes of headers.
const (
	cuePendingMsgs  = 4096
	cuePendingBytes = 4 << 20
)

// Serve serves the map on l until ctx ends; the plan stream's
// republished headers of every plan's new revisions
// (client.PlanRepublishPrefix) cue the pages to redraw. A subscription
// there takes no slot of the stream's consumer cap, which clients share
// (one holding every slot would keep the map from redrawing), and no
// stream stores those subjects, so a push consumer someone points at
// them has its deliveries dropped (client.CueOf), never stored.
func (s *Server) Serve(ctx context.Context, l net.Listener, nc *nats.Conn) error {
	cues := make(chan client.Cue, 64)
	sub, err := nc.Subscribe(client.PlanRepublishPrefix+"*", func(m *nats.Msg) {
		if cue, ok := client.CueOf(m); ok {
			select {
			case cues <- cue:
			default: // the pages redraw on the next one
			}
		}
	})
	if err != nil {
		_ = l.Close()
		return fmt.Errorf("--http-listen: follow the plans: %w", err)
	}
	// Cues are headers: a flood pointed here (a push consumer delivering
	// whole events) is dropped past these, not queued in memory.
	_ = sub.SetPendingLimits(cuePendingMsgs, cuePendingBytes)
	// The revisions already held are taken as seen here, not in the
	// goroutine: one that started late would take a revision that came
	// meanwhile as seen and never cue it.
	seen := map[string]int{}
	for _, p := range s.src.Plans() {
		seen[p.Name] = p.Revision
	}
	go s.follow(ctx, nc, sub, cues, seen)
	lim := s.Limits
	l = limitListener(l, lim.MaxConns)
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: lim.ReadHeader, ReadTimeout: lim.Read,
		IdleTimeout: lim.Idle, WriteTimeout: lim.Write}
	go func() {
		<-ctx.Done()
		close(s.done) // event streams end, or Shutdown would wait on them
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() { _ = srv.Serve(l) }() // ends at Shutdown
	return nil
}

// follow cues the pages with each new revision until ctx ends. Cues
// are core NATS messages, lost while the connection is down: after a
// reconnect every plan the source holds is cued, so that a page shown
// across the outage redraws once.
//
// seen is the newest revision of each plan cued (owned by follow from
// the call on): every tick, a plan the source holds newer than that is
// cued too, so that a cue lost (a full buffer, a flood, a stream whose
// RePublish an older planner removed) delays a redraw by a second at
// most.
func (s *Server) follow(ctx context.Context, nc *nats.Conn, sub *nats.Subscription, cues <-chan client.Cue, seen map[string]int) {
	defer func() { _ = sub.Unsubscribe() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	reconnects := nc.Stats().Reconnects
	for {
		select {
		case <-ctx.Done():
			return
		case cue := <-cues:
			seen[cue.Plan] = max(seen[cue.Plan], cue.Info.Revision)
			s.cue(ctx, Revision{Plan: cue.Plan, Revision: cue.Info.Revision})
		case <-tick.C:
			again := false
			if r := nc.Stats().Reconnects; r != reconnects {
				reconnects, again = r, true
			}
			for _, p := range s.src.Plans() {
				if again || p.Revision > seen[p.Name] {
					seen[p.Name] = max(seen[p.Name], p.Revision)
					s.cue(ctx, Revision{Plan: p.Name, Revision: p.Revision})
				}
			}
		}
	}
}

// Handler is the map's pages: / (the map), /api/map, /api/gpu?node=&gpu=,
// /events (server-sent events: one "revision" per new revision).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /api/map", func(w http.ResponseWriter, _ *http.Request) {
		var drains []plan.Drain
		if d, ok := s.src.(Drains); ok {
			drains = d.DrainedGPUs()
		}
		writeJSON(w, BuildDrained(s.src.Plans(), s.src.Inventory(), drains, time.Now()))
	})
	mux.HandleFunc("GET /api/gpu", s.gpu)
	mux.HandleFunc("GET /events", s.events)
	return mux
}

func (s *Server) gpu(w http.ResponseWriter, r *http.Request) {
	node := r.URL.Query().Get("node")
	gpu, err := strconv.Atoi(r.URL.Query().Get("gpu"))
	if node == "" || err != nil || gpu < 0 {
		http.Error(w, `want ?node=NODE_ID&gpu=INDEX (a whole number >= 0)`, http.StatusBadRequest)
		return
	}
	info, err := Inspect(s.src.Plans(), s.src.Inventory(), node, gpu)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if d, ok := s.src.(Drains); ok {
		info.Drained = drainedText(d.DrainedGPUs(), node, gpu, time.Now())
	}
	writeJSON(w, info)
}

// events streams a "revision" event for each new revision, and a comment
// now and then so that proxies keep the stream open.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	ch := make(chan Revision, 64)
	s.mu.Lock()
	s.clients[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.clients, ch)
		s.mu.Unlock()
	}()
	// The stream outlives the server's WriteTimeout: each write gets a
	// deadline of its own instead.
	rc := http.NewResponseController(w)
	deadline := func() bool { return s.Limits.Write <= 0 || rc.SetWriteDeadline(time.Now().Add(s.Limits.Write)) == nil }
	if !deadline() {
		return
	}
	fmt.Fprint(w, ": poolplanner GPU map\n\n")
	flusher.Flush()
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		case <-keep.C:
			if !deadline() {
				return
			}
			fmt.Fprint(w, ": keepalive\n\n")
		case rev := <-ch:
			if !deadline() {
				return
			}
			b, _ := json.Marshal(rev)
			fmt.Fprintf(w, "event: revision\ndata: %s\n\n", b)
		}
		if err := rc.Flush(); err != nil {
			return // the page went away, or stopped reading
		}
	}
}

// cue has rev announced: by the plan's announcing goroutine if one runs,
// else by a new one.
func (s *Server) cue(ctx context.Context, rev Revision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.waiting[rev.Plan]; ok {
		s.waiting[rev.Plan] = max(cur, rev.Revision)
		return
	}
	s.waiting[rev.Plan] = rev.Revision
	go s.announce(ctx, rev.Plan)
}

// announce tells every page of plan's newest revision once the source
// holds it (the planner stores a revision it published a moment after
// NATS has it), or after a second regardless (a removed plan's last
// revision the source never holds).
func (s *Server) announce(ctx context.Context, plan string) {
	deadline := time.Now().Add(time.Second)
	for {
		s.mu.Lock()
		rev := Revision{Plan: plan, Revision: s.waiting[plan]}
		s.mu.Unlock()
		if s.holds(rev) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := Revision{Plan: plan, Revision: s.waiting[plan]}
	delete(s.waiting, plan)
	for ch := range s.clients {
		select {
		case ch <- rev:
		default: // a page that lags redraws on the next one
		}
	}
}

func (s *Server) holds(rev Revision) bool {
	for _, p := range s.src.Plans() {
		if p.Name == rev.Plan && p.Revision >= rev.Revision {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return // the client went away
	}
}

// limitListener accepts at most n connections open at once (n <= 0: no
// limit): Accept waits for one to close first, so the rest wait in the
// kernel's backlog, where they hold no descriptor of the process.
func limitListener(l net.Listener, n int) net.Listener {
	if n <= 0 {
		return l
	}
	return &limitedListener{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

type limitedListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func (l *limitedListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limitedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when closed (once, however often).
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
