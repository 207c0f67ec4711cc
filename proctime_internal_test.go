package sluice

import (
	"testing"
	"time"
)

// A task's processing time is read once every few records while records
// are quick, and stays within procClockGap of the wall clock; when they
// slow down it is read for each again, and is stale for at most
// procClockMaxEvery records meanwhile.
func TestProcClockBoundsStaleness(t *testing.T) {
	wall := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	reads := 0
	c := procClock{read: func() time.Time { reads++; return wall }}
	// run processes n records of d each in one batch and returns the
	// clock reads and the largest staleness a record saw.
	run := func(n int, d time.Duration) (int, time.Duration) {
		reads = 0
		worst := time.Duration(0)
		c.start()
		for range n {
			got := c.next()
			if got.After(wall) {
				t.Fatalf("processing time %s ahead of the wall clock %s", got, wall)
			}
			worst = max(worst, wall.Sub(got))
			wall = wall.Add(d)
		}
		return reads, worst
	}

	// Quick records: the reads thin out to one per procClockMaxEvery.
	if n, worst := run(10000, time.Microsecond); n > 10000/procClockMaxEvery+20 || worst >= procClockGap {
		t.Fatalf("10,000 records of 1µs: %d clock reads, stale by up to %s", n, worst)
	}
	// A batch boundary reads the clock however long the wait before it.
	wall = wall.Add(time.Hour)
	if _, worst := run(1, time.Microsecond); worst != 0 {
		t.Fatalf("the first record of a batch an hour later is stale by %s", worst)
	}
	// Records that suddenly take 10 ms: stale for at most one stretch of
	// procClockMaxEvery records, then read for each.
	if n, worst := run(1000, 10*time.Millisecond); worst > procClockMaxEvery*10*time.Millisecond || n < 1000-procClockMaxEvery {
		t.Fatalf("1,000 records of 10ms: %d clock reads, stale by up to %s", n, worst)
	}
	if _, worst := run(1000, 10*time.Millisecond); worst != 0 {
		t.Fatalf("records of 10ms once the clock adapted: stale by up to %s, want exact", worst)
	}
	// In between (100µs a record) the reads settle where they stay within
	// procClockGap.
	if n, worst := run(10000, 100*time.Microsecond); worst > procClockGap || n > 10000/4 {
		t.Fatalf("10,000 records of 100µs: %d clock reads, stale by up to %s", n, worst)
	}
}
