package sluice

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/barrier"
)

// A poll never waits past the moment the epoch becomes due: when the input
// goes quiet the barrier would otherwise wait out the poll, up to half an
// interval late (found by the 1 s latency benchmark: p99 1.46 s).
func TestPollWaitEndsByTheEpochsDue(t *testing.T) {
	cfg := barrier.Config{Interval: time.Hour, Timeout: time.Minute}
	for _, clock := range []bool{false, true} {
		start := time.Now()
		in := &Instance{cfg: Options{Checkpoint: cfg}}
		if clock {
			in.cfg.Clock = fixedClock{start}
		}
		l := &loop{in: in, coord: barrier.New(cfg, start.Add(-cfg.Interval+time.Minute), 1)}
		l.coord.SetTasks([]int32{0})
		if got := l.pollWait(); got != cfg.Interval/2 {
			t.Fatalf("clock %v: pollWait with no work = %v, want half the interval", clock, got)
		}
		l.coord.Work(start)
		due, _ := l.coord.Due()
		if got := l.pollWait(); got > due.Sub(start) || got <= 0 {
			t.Fatalf("clock %v: pollWait = %v with the epoch due in %v: want at most that, and some wait", clock, got, due.Sub(start))
		}
	}
}

// Nor does the backoff of a batch whose service was unavailable keep the
// epoch's other work from committing on time (found by review).
func TestUnavailableWaitEndsByTheEpochsDue(t *testing.T) {
	cfg := barrier.Config{Interval: time.Hour, Timeout: time.Minute}
	start := time.Now()
	l := &loop{in: &Instance{cfg: Options{Checkpoint: cfg}}, coord: barrier.New(cfg, start.Add(-cfg.Interval+time.Minute), 1)}
	l.coord.SetTasks([]int32{0})
	l.unavailableFor = 10 * time.Minute
	if got := l.unavailableWait(); got != l.unavailableFor {
		t.Fatalf("unavailableWait with no work = %v, want the backoff", got)
	}
	l.coord.Work(start)
	due, _ := l.coord.Due()
	if got := l.unavailableWait(); got > due.Sub(start) || got <= 0 {
		t.Fatalf("unavailableWait = %v with the epoch due in %v: want at most that, and some wait", got, due.Sub(start))
	}
}

// fixedClock is a test clock that does not move.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }
