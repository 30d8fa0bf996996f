package service

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// waitingParallel is how many tests run at once per CPU when the command
// line does not say (-test.parallel), without the race detector. This
// package's tests mostly wait on timers (leases, settles, TTLs, debounce)
// rather than compute: on two CPUs the whole package took ~11 s of CPU
// in ~50 s at the default of one per CPU, and ~15 s at four per CPU.
// Under the race detector they compute (~50 s of CPU on two CPUs, about
// the wall time), more at once gains nothing and starves the timing of
// the HA tests, so there the default stays.
const waitingParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && !raceEnabled {
		if err := flag.Set("test.parallel", strconv.Itoa(waitingParallel*runtime.GOMAXPROCS(0))); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
