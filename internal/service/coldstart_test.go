package service

import (
	"context"
	"fmt"
	"runtime"
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
// bucket outside the clock. It reports the first replan's own share, the
// heap in use once it is done, and the process's CPU (processCPU).
func BenchmarkColdStart(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchColdStart(b, n) })
	}
}

func benchColdStart(b *testing.B, n int) {
	var took, cpu time.Duration
	var replanning float64
	var heap uint64
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
	b.ReportMetric(float64(cpu.Milliseconds())/float64(k), "process-cpu-ms/op")
}
