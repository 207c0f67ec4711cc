package sluice

import "time"

// Reading the wall clock costs some 50 ns on the benchmark's VM
// (kvm-clock), and a read per record was 6 % of echo's CPU (BENCHMARKS.md).
// So a task reads it for its records' processing time the way Kafka
// Streams caches its system time for a task's records: at the start of
// each batch, then once every few records, as few as keep the time within
// procClockGap of the wall clock.
const (
	// procClockGap is the most two reads are meant to be apart: Kafka's
	// timestamps are in milliseconds.
	procClockGap = time.Millisecond
	// procClockMaxEvery bounds the records between two reads, and so how
	// many records may see a stale time when they suddenly take longer.
	procClockMaxEvery = 32
)

// procClock is a task's processing-time clock when Options.Clock is the
// wall clock (a test's Clock is read for every record). The bound holds
// between reads: a pause within a stretch (a collection, a blocked
// produce, a slow record) leaves the rest of the stretch, at most
// procClockMaxEvery-1 records, with the time it began.
type procClock struct {
	read  func() time.Time // the wall clock (a test's in procclock tests)
	at    time.Time        // the last read
	left  int              // records that may still use at
	every int              // records between reads (0: 1)
}

// start reads the clock for the first record of a batch: the time spent
// waiting for the batch is no guide to how long records take, so nothing
// is learnt from it.
func (c *procClock) start() {
	c.at, c.left = c.now(), max(c.every, 1)
}

// next is the processing time of the next record.
func (c *procClock) next() time.Time {
	if c.left > 0 {
		c.left--
		return c.at
	}
	now := c.now()
	every := max(c.every, 1)
	switch gap := now.Sub(c.at); {
	case gap > procClockGap:
		// Records take longer than they did: read for each again,
		// then space the reads out as long as they stay quick.
		every = 1
	case gap < procClockGap/2:
		every = min(2*every, procClockMaxEvery)
	}
	c.at, c.every, c.left = now, every, every-1
	return now
}

func (c *procClock) now() time.Time {
	if c.read != nil {
		return c.read()
	}
	return time.Now()
}

// beginBatch is called before a task processes a poll's records.
func (t *task) beginBatch(in *Instance) {
	if in.cfg.Clock == nil {
		t.pclock.start()
	}
}

// processingTime is the processing time of the task's next record.
func (t *task) processingTime(in *Instance) time.Time {
	if in.cfg.Clock != nil {
		return in.clock.Now()
	}
	return t.pclock.next()
}
