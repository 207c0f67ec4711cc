package sluice

import (
	"maps"
	"math"
	"time"
)

// noTime is the watermark of a task that has seen no timestamp yet.
const noTime = math.MinInt64

// eventClock is a task's event time (for jobs that declare EventTime): the
// largest timestamp seen per input topic, and the watermark, which trails
// the smallest of those by the allowed out-of-orderness.
//
// The watermark is monotonic. It is part of the epoch like state: the open
// epoch moves it, a commit keeps it (in the marker and the task's meta), an
// abort rewinds it with the input, so a replayed record sees the watermark
// it saw the first time and late records are judged the same way (a job
// with Prefetch sees the watermark before its batch, and its timers fire
// after the batch: both follow where polls end).
//
// A task reads partition p of every input topic. A topic that has had no
// record for idle (when idle > 0) stops holding the watermark back, as
// Flink's withIdleness does; with one input topic that changes nothing.
type eventClock struct {
	ooo    int64 // allowed out-of-orderness, milliseconds
	idle   time.Duration
	topics []string

	wm, committedWM   int64            // unix ms, or noTime
	max, committedMax map[string]int64 // largest timestamp per topic, unix ms
	// The clock as the epoch sealed at its barrier left it (seal).
	sealedWM  int64
	sealedMax map[string]int64
	seen      map[string]time.Time
}

func newEventClock(topics []string, ooo, idle time.Duration, wm time.Time, now time.Time) *eventClock {
	c := &eventClock{
		ooo:          ooo.Milliseconds(),
		idle:         idle,
		topics:       topics,
		wm:           noTime,
		max:          map[string]int64{},
		committedMax: map[string]int64{},
		seen:         map[string]time.Time{},
	}
	if !wm.IsZero() {
		c.wm = wm.UnixMilli()
	}
	c.committedWM = c.wm
	for _, t := range topics {
		c.seen[t] = now // idleness counts from the task's start
	}
	return c
}

// observe takes a record's timestamp and reports whether the watermark
// moved.
func (c *eventClock) observe(topic string, ts time.Time, now time.Time) bool {
	ms := ts.UnixMilli()
	if m, ok := c.max[topic]; !ok || ms > m {
		c.max[topic] = ms
	}
	if c.idleMatters() {
		c.seen[topic] = now // only idleness reads it: no map write per record otherwise
	}
	return c.advance(now)
}

// advance recomputes the watermark from the topics' maxima, skipping idle
// topics, and reports whether it moved.
func (c *eventClock) advance(now time.Time) bool {
	low, active := int64(math.MaxInt64), false
	for _, t := range c.topics {
		if c.idleMatters() && now.Sub(c.seen[t]) >= c.idle {
			continue
		}
		m, ok := c.max[t]
		if !ok {
			return false // an active input with no timestamp yet holds event time back
		}
		low, active = min(low, m), true
	}
	if !active {
		return false
	}
	w := low - c.ooo
	if low < noTime+c.ooo {
		w = noTime // cannot go below "none"
	}
	if w <= c.wm {
		return false
	}
	c.wm = w
	return true
}

// idleMatters reports whether advance can move the watermark without a
// record: only when a quiet topic may turn idle.
func (c *eventClock) idleMatters() bool { return c.idle > 0 && len(c.topics) > 1 }

// watermark is the current watermark, the zero time when there is none.
func (c *eventClock) watermark() time.Time { return msTime(c.wm) }

// commit keeps the open epoch's event time; rewind drops it.
func (c *eventClock) commit() {
	c.committedWM = c.wm
	c.committedMax = maps.Clone(c.max)
}

// seal keeps the clock as the epoch ending at its barrier leaves it, for
// commitSealed once that epoch committed (pipelined epochs): the epoch after
// it moves the clock meanwhile.
func (c *eventClock) seal() {
	c.sealedWM = c.wm
	c.sealedMax = maps.Clone(c.max)
}

// commitSealed commits the clock as seal kept it.
func (c *eventClock) commitSealed() {
	c.committedWM = c.sealedWM
	c.committedMax = c.sealedMax
}

func (c *eventClock) rewind() {
	c.wm = c.committedWM
	c.max = maps.Clone(c.committedMax)
}

func msTime(ms int64) time.Time {
	if ms == noTime {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
