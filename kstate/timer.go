package kstate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"
)

// TimeDomain is the clock a timer runs on.
type TimeDomain byte

const (
	// EventTime timers fire when the task's watermark passes them.
	EventTime TimeDomain = 1
	// ProcessingTime timers fire when the wall clock passes them.
	ProcessingTime TimeDomain = 2
)

// String returns the domain's name.
func (d TimeDomain) String() string {
	switch d {
	case EventTime:
		return "event-time"
	case ProcessingTime:
		return "processing-time"
	}
	return fmt.Sprintf("TimeDomain(%d)", byte(d))
}

func (d TimeDomain) valid() bool { return d == EventTime || d == ProcessingTime }

// Timer is a registered timer: fire for Key when Domain's clock reaches At.
//
// Timers are state like any other: they live in the Store under KindTimer,
// so they take part in the record and epoch write-sets, are changelogged
// with the epoch that registered them, and come back with a restore. The
// physical key is
//
//	EncodeKey(KindTimer, "", nil, [domain][8-byte big-endian unix ms][key])
//
// with an empty value, so a backend scan of one domain's prefix yields
// timers by time and then key, and registering the same timer twice leaves
// one (Flink's deduplication). Times before 1970 are stored as 1970: the
// fixed-width unsigned encoding is what keeps the order.
type Timer struct {
	Domain TimeDomain
	At     time.Time // millisecond precision
	Key    []byte    // nil when the record key was empty
}

// appendTimerKey appends a timer's physical key (see Timer) to dst.
func appendTimerKey(dst []byte, d TimeDomain, ms int64, key []byte) []byte {
	dst = AppendKey(dst, KindTimer, "", nil, nil)
	dst = append(dst, byte(d))
	dst = binary.BigEndian.AppendUint64(dst, uint64(ms))
	return append(dst, key...)
}

// timerPrefixLen is the length of EncodeKey(KindTimer, "", nil, nil).
const timerPrefixLen = 4

// timerKindPrefix is EncodeKey(KindTimer, "", nil, nil).
var timerKindPrefix = AppendKey(nil, KindTimer, "", nil, nil)

// timerDomainOf returns the domain of a timer's physical key, 0 for any
// other key.
func timerDomainOf(key []byte) TimeDomain {
	if len(key) <= timerPrefixLen || !bytes.HasPrefix(key, timerKindPrefix) {
		return 0
	}
	return TimeDomain(key[timerPrefixLen])
}

func timerMillis(t time.Time) int64 { return max(t.UnixMilli(), 0) }

// RegisterTimer registers a timer for the current record key. It panics on
// an invalid domain, a programming error. A key too long to store is
// reported through Store.RecordErr.
func RegisterTimer(s Scope, d TimeDomain, at time.Time) {
	st := s.Store()
	ms := timerMillis(at)
	st.keyBuf = appendTimerKey(st.keyBuf[:0], mustDomain(d), ms, s.Key())
	st.putOwned(st.keyBuf, []byte{})
	if f := &st.timerFloor[d]; !f.set || ms < f.ms {
		*f = timerFloor{ms: ms, set: true}
	}
}

// timerFloor is the earliest time registered in a domain since the last
// TakeTimerFloor.
type timerFloor struct {
	ms  int64
	set bool
}

// TakeTimerFloor returns the earliest time (unix ms) registered for domain
// d since the last call, and forgets it: a runtime keeps its own earliest
// timer per domain without scanning, whichever way a timer was registered.
// The floor counts registrations of records later rolled back too, which
// only makes a runtime look early.
func (s *Store) TakeTimerFloor(d TimeDomain) (int64, bool) {
	f := s.timerFloor[mustDomain(d)]
	s.timerFloor[d] = timerFloor{}
	return f.ms, f.set
}

// DeleteTimer deletes the current record key's timer, if registered.
func DeleteTimer(s Scope, d TimeDomain, at time.Time) {
	st := s.Store()
	st.keyBuf = appendTimerKey(st.keyBuf[:0], mustDomain(d), timerMillis(at), s.Key())
	st.Delete(st.keyBuf)
}

// RemoveTimer deletes t, typically after it fired. It panics on an invalid
// domain.
func RemoveTimer(st *Store, t Timer) {
	st.keyBuf = appendTimerKey(st.keyBuf[:0], mustDomain(t.Domain), timerMillis(t.At), t.Key)
	st.Delete(st.keyBuf)
}

// DueTimers returns the timers of domain d at or before upTo, ascending by
// time and then key, as the Store sees them (write-sets included); at most
// max of them when max > 0. It does not remove them: the caller fires each
// and calls RemoveTimer, so a failure before the epoch commits leaves them
// registered.
func DueTimers(st *Store, d TimeDomain, upTo time.Time, max int) ([]Timer, error) {
	if !d.valid() {
		return nil, fmt.Errorf("kstate: DueTimers: invalid time domain %d", d)
	}
	limit := upTo.UnixMilli()
	var due []Timer
	err := scanTimers(st, d, func(t Timer) error {
		if t.At.UnixMilli() > limit {
			return ErrStopScan
		}
		due = append(due, t)
		if max > 0 && len(due) == max {
			return ErrStopScan
		}
		return nil
	})
	return due, err
}

// HasTimer reports whether t is registered, as the Store sees it: a timer
// listed by DueTimers may have been deleted since by another timer's
// handler.
func HasTimer(st *Store, t Timer) (bool, error) {
	st.keyBuf = appendTimerKey(st.keyBuf[:0], mustDomain(t.Domain), timerMillis(t.At), t.Key)
	_, ok, err := st.Get(st.keyBuf)
	return ok, err
}

// TimerKey returns t's physical key (see Timer).
func TimerKey(t Timer) []byte {
	return appendTimerKey(nil, mustDomain(t.Domain), timerMillis(t.At), t.Key)
}

// TimerPrefix is the physical-key prefix of every timer of domain d: a
// changelog or backend key with it is one of d's timers.
func TimerPrefix(d TimeDomain) []byte {
	return appendTimerKey(nil, mustDomain(d), 0, nil)[:timerPrefixLen+1]
}

// NextTimer returns the earliest timer of domain d, so a runtime can sleep
// until it instead of polling DueTimers.
func NextTimer(st *Store, d TimeDomain) (Timer, bool, error) {
	if !d.valid() {
		return Timer{}, false, fmt.Errorf("kstate: NextTimer: invalid time domain %d", d)
	}
	var next Timer
	found := false
	err := scanTimers(st, d, func(t Timer) error {
		next, found = t, true
		return ErrStopScan
	})
	return next, found, err
}

func scanTimers(st *Store, d TimeDomain, fn func(Timer) error) error {
	return st.Scan(TimerPrefix(d), func(k, _ []byte) error {
		t, err := DecodeTimer(k)
		if err != nil {
			return err
		}
		return fn(t)
	})
}

// DecodeTimer parses the physical key of a timer, for tools that read a
// backend or a changelog. Timer.Key is a copy.
func DecodeTimer(key []byte) (Timer, error) {
	k, err := DecodeKey(key)
	if err != nil {
		return Timer{}, err
	}
	if k.Kind != KindTimer || k.Name != "" || k.UserKey != nil {
		return Timer{}, fmt.Errorf("%w: not a timer key (kind %v)", ErrBadKey, k.Kind)
	}
	if len(k.Sub) < 9 || !TimeDomain(k.Sub[0]).valid() {
		return Timer{}, fmt.Errorf("%w: malformed timer sub-key", ErrBadKey)
	}
	t := Timer{
		Domain: TimeDomain(k.Sub[0]),
		At:     time.UnixMilli(int64(binary.BigEndian.Uint64(k.Sub[1:9]))),
	}
	if len(k.Sub) > 9 {
		t.Key = append([]byte{}, k.Sub[9:]...)
	}
	return t, nil
}

func mustDomain(d TimeDomain) TimeDomain {
	if !d.valid() {
		panic(fmt.Sprintf("kstate: invalid time domain %d", d))
	}
	return d
}
