package window

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/late"
)

// operator runs a Spec: Process assigns records to windows and updates
// them; OnTimer fires and clears them.
//
// The window index (stores.windows) is the truth about a key's windows;
// timers only say when to look at it. A timer at T fires every window of
// the key that has not fired and ends at T, clears every window whose
// end + lateness is T, and, with Spec.EarlyInterval, fires early every
// window still open at T that changed since it last fired, when T is a
// multiple of the interval. So a timer shared by two windows (one per key,
// domain and millisecond: one window's end can be another's cleanup time)
// serves both, and a stale timer finds nothing to do.
//
// Matching T exactly, rather than every window due by T, keeps one window
// whose function keeps failing (its firing is rolled back and
// dead-lettered) from failing every later timer of its key too.
type operator[IN, OUT any] struct {
	spec     Spec[IN, OUT]
	fn       Function[IN, OUT]
	assigner Assigner
	lateness int64 // ms
	// earlyEvery and earlyCount are Spec.EarlyInterval (ms) and
	// EarlyCount; 0 for none.
	earlyEvery, earlyCount int64
	st                     stores[IN]
}

func newOperator[IN, OUT any](s Spec[IN, OUT]) *operator[IN, OUT] {
	return &operator[IN, OUT]{
		spec:       s,
		fn:         s.Function,
		assigner:   s.Assigner,
		lateness:   s.AllowedLateness.Milliseconds(),
		earlyEvery: s.EarlyInterval.Milliseconds(),
		earlyCount: int64(s.EarlyCount),
		st:         newStores(s.Name, s.Function.elements),
	}
}

// clock is what a record is judged by: its time in the assigner's domain,
// and the watermark (event time; ok is false until the task has one) or the
// processing time it was processed at.
type clock struct {
	t, wm int64 // unix ms
	ok    bool
}

func (o *operator[IN, OUT]) clockOf(ctx sluice.Context) clock {
	if !o.assigner.EventTime() {
		now := ctx.Now().UnixMilli()
		return clock{t: now, wm: now, ok: false}
	}
	wm := ctx.CurrentWatermark()
	return clock{t: ctx.Timestamp().UnixMilli(), wm: wm.UnixMilli(), ok: !wm.IsZero()}
}

// late reports whether window s can take no more elements: the watermark
// has reached its cleanup time (Flink's isWindowLate). Sluice's watermark
// has no extra millisecond (docs/time.md), so Flink's
// "maxTimestamp + lateness <= watermark" reads end + lateness <= watermark
// here, and a window fires when the watermark reaches its end.
func (o *operator[IN, OUT]) late(s span, c clock) bool {
	return c.ok && s.end+o.lateness <= c.wm
}

func (o *operator[IN, OUT]) process(ctx sluice.Context, rec *sluice.Record) error {
	in, err := o.spec.Decode(rec)
	if err != nil {
		return err
	}
	if o.assigner.counting() {
		return o.addToCounts(ctx, in)
	}
	c := o.clockOf(ctx)
	var buf [4]span
	spans := o.assigner.assign(buf[:0], c.t)
	if o.assigner.merging() {
		own := spans[0]
		if o.assigner.dynamic {
			gap := o.spec.SessionGap(in)
			if gap < time.Millisecond {
				return fmt.Errorf("window: SessionGap gave %s for the record: want at least 1ms", gap)
			}
			own.end = c.t + gap.Milliseconds()
		}
		return o.addToSession(ctx, rec, own, in, c)
	}
	accepted := false
	for _, s := range spans {
		if o.late(s, c) {
			continue
		}
		accepted = true
		e, ok, err := o.st.windows.Get(ctx, s)
		if err != nil {
			return err
		}
		if !ok {
			e = entry{slot: s}
		}
		if err := o.add(ctx, s, &e, !ok, in, c); err != nil {
			return err
		}
	}
	if !accepted {
		return o.tooLate(ctx, rec)
	}
	return nil
}

// add adds in to window s (whose entry is e, new if created), arms its
// timers and stores the entry.
//
// A window whose end the watermark has passed fires again at once (its
// timer, behind the watermark, fires right after this record): a late
// firing, with everything the window holds, as Flink's default trigger
// does.
//
// Early firings: each element arms a timer at the next multiple of
// EarlyInterval after the clock, if the window has not ended by then (the
// same millisecond again is the same timer), so a window whose early
// firing failed, or state from before EarlyInterval was set or changed,
// gets one too; an element that brings the count to a multiple of
// EarlyCount fires the window at once.
func (o *operator[IN, OUT]) add(ctx sluice.Context, s span, e *entry, created bool, in IN, c clock) error {
	if err := o.addElement(ctx, e, in); err != nil {
		return err
	}
	ended := e.fired || c.ok && s.end <= c.wm
	if created || ended {
		o.register(ctx, s.end)
	}
	if created && o.lateness > 0 {
		o.register(ctx, s.end+o.lateness)
	}
	if o.earlyEvery > 0 && !ended {
		if next := o.nextEarly(s, c); next < s.end {
			o.register(ctx, next)
		}
	}
	e.fired, e.emitted = false, false
	if o.earlyCount > 0 && !ended && e.count%o.earlyCount == 0 {
		fired, err := o.fireEarly(ctx, window{s, *e})
		if err != nil {
			return err
		}
		e.emitted = fired
	}
	return o.st.windows.Put(ctx, s, *e)
}

// nextEarly is the first multiple of EarlyInterval after the clock (the
// watermark, once the task has one, or the processing time) and after the
// window's start.
func (o *operator[IN, OUT]) nextEarly(s span, c clock) int64 {
	from := s.start
	if c.ok || !o.assigner.EventTime() {
		from = max(from, c.wm)
	}
	return from - floorMod(from, o.earlyEvery) + o.earlyEvery
}

func (o *operator[IN, OUT]) addElement(ctx sluice.Context, e *entry, in IN) error {
	if !o.fn.incremental() {
		if err := o.st.elements.Put(ctx, elementKey{e.slot, e.count}, in); err != nil {
			return err
		}
		e.count++
		return nil
	}
	var err error
	if e.count == 0 {
		e.acc, err = o.fn.first(in)
	} else {
		e.acc, err = o.fn.add(e.acc, in)
	}
	e.count++
	return err
}

func (o *operator[IN, OUT]) register(ctx sluice.Context, ms int64) {
	if o.assigner.EventTime() {
		ctx.Timers().RegisterEventTime(time.UnixMilli(ms))
	} else {
		ctx.Timers().RegisterProcessingTime(time.UnixMilli(ms))
	}
}

// timerTime is the millisecond a timer registered at ms fires at: the
// engine stores times before 1970 as 1970, so windows that end before then
// share the timer at 0.
func timerTime(ms int64) int64 { return max(ms, 0) }

func (o *operator[IN, OUT]) unregister(ctx sluice.Context, ms int64) {
	if o.assigner.EventTime() {
		ctx.Timers().DeleteEventTime(time.UnixMilli(ms))
	} else {
		ctx.Timers().DeleteProcessingTime(time.UnixMilli(ms))
	}
}

// tooLate handles a record that no window takes.
func (o *operator[IN, OUT]) tooLate(ctx sluice.Context, rec *sluice.Record) error {
	return late.Handle(ctx, rec, o.spec.LateOutput, o.st.dropped, o.spec.LateDropped)
}

// window is one entry of the index.
type window struct {
	s span
	e entry
}

// errStop ends a scan of the index early.
var errStop = errors.New("stop")

// windows returns the key's windows that start at or before upTo, in time
// order.
func (o *operator[IN, OUT]) windows(ctx sluice.Context, upTo int64) ([]window, error) {
	var ws []window
	err := o.st.windows.Entries(ctx, func(s span, e entry) error {
		if s.start > upTo {
			return errStop
		}
		ws = append(ws, window{s, e})
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return ws, err
}

func (o *operator[IN, OUT]) onTimer(ctx sluice.Context, t sluice.Timer) error {
	at := t.At.UnixMilli()
	ws, err := o.windows(ctx, at)
	if err != nil {
		return err
	}
	for _, w := range ws {
		// The firing timer at the end comes before the cleanup timer
		// at end + lateness, so a window that reaches its cleanup
		// unfired is one whose firing failed: it is cleared, not tried
		// again.
		fire := !w.e.fired && timerTime(w.s.end) == at
		cleanup := timerTime(w.s.end+o.lateness) == at
		if o.early(w, at) {
			fired, err := o.fireEarly(ctx, w)
			if err != nil {
				return err
			}
			if fired {
				w.e.emitted = true
				if err := o.st.windows.Put(ctx, w.s, w.e); err != nil {
					return err
				}
			}
			continue
		}
		if fire {
			if err := o.fire(ctx, w); err != nil {
				return err
			}
			w.e.fired = true
		}
		switch {
		case cleanup:
			if err := o.clear(ctx, w); err != nil {
				return err
			}
		case fire:
			if err := o.st.windows.Put(ctx, w.s, w.e); err != nil {
				return err
			}
		}
	}
	return nil
}

// early reports whether a timer at at fires w early: at is a multiple of
// EarlyInterval before w's end, and w changed since it last fired. The
// timer may be another window's (timers are one per key and millisecond):
// w's own early timer would be at the same multiple. A failing early
// firing fails nothing (fireEarly), so sharing the timer is safe.
func (o *operator[IN, OUT]) early(w window, at int64) bool {
	return o.earlyEvery > 0 && at%o.earlyEvery == 0 && at < w.s.end && !w.e.fired && !w.e.emitted
}

// fire computes the window's results and emits them, keyed by the key and
// stamped with the window's last millisecond, as Flink stamps them, so
// that a later job's window of the same size takes them into the same
// window, whether the firing is the timer's or a late record's.
func (o *operator[IN, OUT]) fire(ctx sluice.Context, w window) error {
	c, vals, err := o.compute(ctx, w)
	if err != nil {
		return err
	}
	emitAll(c, vals)
	return nil
}

// fireEarly fires w early: its results go out only once the window
// function and Encode have succeeded. An error of either drops this early
// firing (fired false) and counts it (Spec.EarlyFailed): it does not fail
// the record or timer at hand, whose other work (an element, another
// window's firing at the same timer) would go with it. The window keeps
// its elements and fires at its end, where an error that persists is
// dead-lettered as any firing's. A sluice.Fatal error, or a state read
// that fails, is returned.
func (o *operator[IN, OUT]) fireEarly(ctx sluice.Context, w window) (fired bool, err error) {
	c, vals, err := o.compute(ctx, w)
	var read readError
	switch {
	case err == nil:
		emitAll(c, vals)
		return true, nil
	case sluice.IsFatal(err) || errors.As(err, &read):
		return false, err
	}
	if o.spec.EarlyFailed != nil {
		o.spec.EarlyFailed.Inc()
	}
	return false, nil
}

// emitAll emits a firing's values keyed by c's key.
func emitAll(c sluice.Context, vals [][]byte) {
	for _, v := range vals {
		c.Emit(c.Key(), v)
	}
}

// readError is a failure to read a window's elements from state: not the
// window function's.
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// compute runs the window function over w and returns its results,
// encoded, with the context stamped with the window's MaxTimestamp, which
// they go out through.
func (o *operator[IN, OUT]) compute(ctx sluice.Context, w window) (sluice.Context, [][]byte, error) {
	win := w.s.window()
	if w.e.timed { // a count window: its span is in records, not time
		win = w.e.times.window()
	}
	ctx = sluice.WithTimestamp(ctx, win.MaxTimestamp())
	key := ctx.Key()
	var vals [][]byte
	var emitErr error
	emit := func(out OUT) {
		if emitErr != nil {
			return
		}
		v, err := o.spec.Encode(key, win, out)
		if err != nil {
			emitErr = err
			return
		}
		vals = append(vals, v)
	}
	var err error
	if o.fn.incremental() {
		err = o.fn.fire(ctx, win, w.e.acc, emit)
	} else {
		var elems []IN
		var rerr error
		if w.e.timed {
			elems, rerr = o.countElements(ctx, w)
		} else {
			elems, rerr = o.elements(ctx, w.e)
		}
		if rerr != nil {
			return nil, nil, readError{rerr}
		}
		err = o.fn.process(ctx, win, elems, emit)
	}
	if err == nil {
		err = emitErr
	}
	return ctx, vals, err
}

var errMissing = errors.New("window: an element of the window is missing from state")

func (o *operator[IN, OUT]) elements(ctx sluice.Context, e entry) ([]IN, error) {
	return o.readElements(ctx, e.slot, 0, e.count)
}

// readElements reads the elements numbered from to to-1 in slot.
func (o *operator[IN, OUT]) readElements(ctx sluice.Context, slot span, from, to int64) ([]IN, error) {
	elems := make([]IN, 0, to-from)
	for n := from; n < to; n++ {
		v, ok, err := o.st.elements.Get(ctx, elementKey{slot, n})
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errMissing
		}
		elems = append(elems, v)
	}
	return elems, nil
}

// clear removes a window and its elements.
func (o *operator[IN, OUT]) clear(ctx sluice.Context, w window) error {
	if err := o.st.windows.Remove(ctx, w.s); err != nil {
		return err
	}
	return o.removeElements(ctx, w.e.slot, 0, w.e.count)
}

func (o *operator[IN, OUT]) removeElements(ctx sluice.Context, slot span, from, to int64) error {
	if o.fn.incremental() {
		return nil
	}
	for n := from; n < to; n++ {
		if err := o.st.elements.Remove(ctx, elementKey{slot, n}); err != nil {
			return err
		}
	}
	return nil
}
