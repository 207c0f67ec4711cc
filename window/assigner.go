package window

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Assigner says which windows a record belongs to, and on which clock they
// close. Build one with TumblingEventTime, SlidingEventTime,
// EventTimeSession or their processing-time twins, or with TumblingCount
// or SlidingCount for windows of a number of records; the zero Assigner is
// invalid.
type Assigner struct {
	kind   assignerKind
	domain sluice.TimeDomain
	// tumbling and sliding: window length, ms; count windows: records
	size int64
	// sliding: distance between window starts, ms; count windows: the
	// records between firings
	slide int64
	gap   int64 // sessions: inactivity that closes a session, ms
	// dynamic: sessions whose gap each record gives (Spec.SessionGap)
	dynamic bool
	// offset shifts tumbling and sliding windows from multiples of their
	// step since the epoch (WithOffset), ms; given is as it was given.
	offset    int64
	offsetSet bool
	given     time.Duration
}

type assignerKind byte

const (
	tumbling assignerKind = iota + 1
	sliding
	session
	tumblingCount
	slidingCount
)

// TumblingEventTime puts each record in the one window of length size that
// holds its event time; windows start at multiples of size since the Unix
// epoch. They close when the watermark reaches their end.
func TumblingEventTime(size time.Duration) Assigner {
	return Assigner{kind: tumbling, domain: sluice.EventTime, size: size.Milliseconds()}
}

// TumblingProcessingTime is TumblingEventTime on the processing-time clock
// (Context.Now when the record is processed): windows close when the clock
// reaches their end.
func TumblingProcessingTime(size time.Duration) Assigner {
	return Assigner{kind: tumbling, domain: sluice.ProcessingTime, size: size.Milliseconds()}
}

// SlidingEventTime puts each record in every window of length size that
// holds its event time, windows starting every slide (at multiples of slide
// since the Unix epoch): size/slide windows per record when slide divides
// size.
func SlidingEventTime(size, slide time.Duration) Assigner {
	return Assigner{kind: sliding, domain: sluice.EventTime, size: size.Milliseconds(), slide: slide.Milliseconds()}
}

// SlidingProcessingTime is SlidingEventTime on the processing-time clock.
func SlidingProcessingTime(size, slide time.Duration) Assigner {
	return Assigner{kind: sliding, domain: sluice.ProcessingTime, size: size.Milliseconds(), slide: slide.Milliseconds()}
}

// EventTimeSession puts each record in a session of its key: the record's
// own window is [t, t+gap), and windows of the same key that overlap or
// touch merge into one, so a session ends gap after its last record.
// A record that falls between two sessions and bridges them merges them.
func EventTimeSession(gap time.Duration) Assigner {
	return Assigner{kind: session, domain: sluice.EventTime, gap: gap.Milliseconds()}
}

// ProcessingTimeSession is EventTimeSession on the processing-time clock:
// a session ends when no record of its key was processed for gap.
func ProcessingTimeSession(gap time.Duration) Assigner {
	return Assigner{kind: session, domain: sluice.ProcessingTime, gap: gap.Milliseconds()}
}

// DynamicEventTimeSession is EventTimeSession whose gap each record gives,
// with Spec.SessionGap (Flink's EventTimeSessionWindows.withDynamicGap): a
// record's own window is [t, t+SessionGap(element)), and windows of the
// key that overlap or touch merge, so a session ends at the latest end
// of its records' windows.
func DynamicEventTimeSession() Assigner {
	return Assigner{kind: session, domain: sluice.EventTime, dynamic: true}
}

// DynamicProcessingTimeSession is DynamicEventTimeSession on the
// processing-time clock.
func DynamicProcessingTimeSession() Assigner {
	return Assigner{kind: session, domain: sluice.ProcessingTime, dynamic: true}
}

// TumblingCount puts a key's records in windows of size records each, in
// the order they are processed (a partition's order): each size-th record
// of a key fires the window of it and the size-1 records before it, and
// the window is cleared (Flink's countWindow(size), a global window with a
// purging count trigger). No clock is involved: a window that is not full
// waits for its remaining records, however long that takes. The Window a
// function gets spans its records' Kafka times (count windows).
func TumblingCount(size int) Assigner {
	return Assigner{kind: tumblingCount, size: int64(size), slide: int64(size)}
}

// SlidingCount fires a key's window every slide records, with the last
// size records of the key (fewer until size have come), in the order they
// were processed: Flink's countWindow(size, slide), a global window with a
// count evictor and a count trigger. A record is in up to ⌈size/slide⌉
// windows, and updates each window's entry (and accumulator), as a record
// of a sliding window of time does; a Process function's records are
// stored once each. With slide < size the key keeps its open windows and
// its last records in state for good.
func SlidingCount(size, slide int) Assigner {
	return Assigner{kind: slidingCount, size: int64(size), slide: int64(slide)}
}

// WithOffset returns the assigner with its windows shifted by offset from
// the Unix epoch's multiples, as Flink's TumblingEventTimeWindows.of(size,
// offset): daily windows in a time zone 8 hours behind UTC are
// TumblingEventTime(24*time.Hour).WithOffset(8*time.Hour), each from
// 08:00 UTC, midnight there; Flink's example, days at UTC+08:00, is
// WithOffset(-8*time.Hour), each from 16:00 UTC. Tumbling and sliding
// windows only; |offset| must be less than the size (tumbling) or the
// slide (sliding), in whole milliseconds.
func (a Assigner) WithOffset(offset time.Duration) Assigner {
	a.offset, a.offsetSet, a.given = offset.Milliseconds(), true, offset
	return a
}

// step is the distance between window starts of a tumbling or sliding
// assigner.
func (a Assigner) step() int64 {
	if a.kind == sliding {
		return a.slide
	}
	return a.size
}

// EventTime reports whether the windows run on event time.
func (a Assigner) EventTime() bool { return a.domain == sluice.EventTime }

// merging reports whether windows of a key merge (sessions).
func (a Assigner) merging() bool { return a.kind == session }

// Count reports whether the windows are counts of records (TumblingCount,
// SlidingCount) rather than spans of time.
func (a Assigner) Count() bool { return a.counting() }

func (a Assigner) counting() bool { return a.kind == tumblingCount || a.kind == slidingCount }

func (a Assigner) validate() error {
	switch a.kind {
	case tumbling:
		if a.size <= 0 {
			return fmt.Errorf("tumbling window size %s: want at least 1ms", time.Duration(a.size)*time.Millisecond)
		}
	case sliding:
		if a.size <= 0 || a.slide <= 0 {
			return fmt.Errorf("sliding window size %s, slide %s: want both at least 1ms", time.Duration(a.size)*time.Millisecond, time.Duration(a.slide)*time.Millisecond)
		}
	case session:
		if a.gap <= 0 && !a.dynamic {
			return fmt.Errorf("session gap %s: want at least 1ms", time.Duration(a.gap)*time.Millisecond)
		}
	case tumblingCount, slidingCount:
		if a.size <= 0 || a.slide <= 0 || a.size > maxCount || a.slide > maxCount {
			return fmt.Errorf("count window size %d, slide %d: want 1 to %d records", a.size, a.slide, int64(maxCount))
		}
	default:
		return fmt.Errorf("no window assigner (use TumblingEventTime, SlidingEventTime, EventTimeSession, a processing-time one, TumblingCount or SlidingCount)")
	}
	switch {
	case !a.offsetSet:
	case a.kind == session:
		return fmt.Errorf("WithOffset is for tumbling and sliding windows: a session starts at its first record")
	case a.counting():
		return fmt.Errorf("WithOffset is for tumbling and sliding windows of time, not of counts")
	case a.given%time.Millisecond != 0 || a.offset <= -a.step() || a.offset >= a.step():
		return fmt.Errorf("window offset %s: want whole milliseconds, less than %s either way (the windows' step)", a.given, time.Duration(a.step())*time.Millisecond)
	}
	return nil
}

// assign appends the windows of a record at t (unix ms) to dst, latest
// start first for sliding windows, as Flink lists them.
func (a Assigner) assign(dst []span, t int64) []span {
	switch a.kind {
	case tumbling:
		start := t - floorMod(t-a.offset, a.size)
		return append(dst, span{start, start + a.size})
	case sliding:
		for start := t - floorMod(t-a.offset, a.slide); start > t-a.size; start -= a.slide {
			dst = append(dst, span{start, start + a.size})
		}
		return dst
	default:
		return append(dst, span{t, t + a.gap})
	}
}

// floorMod is the modulus with the divisor's sign, so that times before
// 1970 fall in the window below them rather than above.
func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
