package service

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/internal/metrics"
	"github.com/poolplanner/poolplanner/internal/natstest"
)

// BenchmarkColdStart is the time from a planner starting on a filled
// inventory bucket (n nodes, no plan yet) to the replan that publishes
// its first revision done: the event, the snapshot and every node's
// assignment acknowledged. Each round starts a new server and fills its
// bucket outside the clock. It reports the first replan's own share,
// the heap in use once it is done (and live, after a collection), the
// process's peak resident set from the planner's start on (peakRSS),
// and the process's CPU (processCPU). POOLPLANNER_HEAP_PROFILE=FILE
// writes the heap's profile once the first round's revision is out,
// the planner running (go tool pprof -sample_index=inuse_space).
func BenchmarkColdStart(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchColdStart(b, n) })
	}
}

func benchColdStart(b *testing.B, n int) {
	var took, cpu time.Duration
	var replanning float64
	var heap, live, rss uint64
	k := 0
	for b.Loop() {
		b.StopTimer()
		srv := natstest.Start(b)
		nc := srv.Conn(b)
		js, _ := jetstream.New(nc)
		fillBucket(b, js, n)
		s := &scale{url: srv.URL(), reg: prometheus.NewRegistry()}
		s.planner = srv.Conn(b)
		pjs, _ := jetstream.New(s.planner)
		ctx, cancel := context.WithCancel(context.Background())
		p := New(Config{NC: s.planner, JS: pjs, Spec: []byte(scaleSpec(n)), Log: zerolog.Nop(), Metrics: metrics.NewPlanner(s.reg)})
		done := make(chan error, 1)
		runtime.GC()
		rssKnown := resetPeakRSS()
		b.StartTimer()
		c0, t0 := processCPU(), time.Now()
		go func() { done <- p.Run(ctx) }()
		s.waitPublished(b, 1)
		took += time.Since(t0)
		cpu += processCPU() - c0
		b.StopTimer()
		replanning += s.replanSeconds(b)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap = max(heap, ms.HeapInuse)
		// What the planner and the server hold, without the garbage
		// HeapInuse counts until the next collection.
		runtime.GC()
		runtime.ReadMemStats(&ms)
		live = max(live, ms.HeapAlloc)
		if path := os.Getenv("POOLPLANNER_HEAP_PROFILE"); path != "" && k == 0 {
			writeHeapProfile(b, path)
		}
		if rssKnown {
			rss = max(rss, peakRSS())
		}
		cancel()
		if err := <-done; err != nil {
			b.Fatalf("planner: %v", err)
		}
		k++
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(k), "ms-to-last-assignment/op")
	b.ReportMetric(1000*replanning/float64(k), "ms-first-replan/op")
	b.ReportMetric(float64(heap>>20), "MiB-heap-inuse")
	b.ReportMetric(float64(live>>20), "MiB-heap-live")
	if rss > 0 {
		// The process's: planner, embedded server and test together,
		// from the planner's start on.
		b.ReportMetric(float64(rss>>20), "MiB-peak-rss")
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(k), "process-cpu-ms/op")
}

// writeHeapProfile writes the heap's profile, as of a collection now, to
// path.
func writeHeapProfile(b *testing.B, path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}
