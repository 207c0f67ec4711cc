package window

import (
	"errors"
	"math"

	"github.com/sluicehq/sluice"
)

// Sessions merge as Flink's MergingWindowSet merges them: a record's own
// window [t, t+gap) joins every session of its key that it overlaps or
// touches, and the result covers them all. The key's sessions are kept
// merged, so they never touch each other and a record can bridge several.
//
// Merging moves state and timers:
//
//   - accumulators merge (Merger, or the reduce function); elements move
//     to the slot of the session with the most elements, whose own stay
//     where they are;
//   - the merged session gets its timers (end, and end + lateness), and
//     the timers of the sessions it absorbed are deleted, unless another
//     window of the key still needs the same millisecond: timers are one
//     per key, domain and millisecond, so deleting a shared one would
//     lose the other window's firing.
func (o *operator[IN, OUT]) addToSession(ctx sluice.Context, rec *sluice.Record, own span, in IN, c clock) error {
	all, err := o.windows(ctx, math.MaxInt64)
	if err != nil {
		return err
	}
	var hits, others []window
	for _, w := range all {
		if w.s.intersects(own) {
			hits = append(hits, w)
		} else {
			others = append(others, w)
		}
	}
	switch {
	case len(hits) == 0:
		// The key's live sessions are never late (their cleanup timers
		// fire as soon as the watermark passes), so only a record that
		// joins none can be.
		if o.late(own, c) {
			return o.tooLate(ctx, rec)
		}
		e := entry{slot: own}
		return o.add(ctx, own, &e, true, in, c)
	case len(hits) == 1 && hits[0].s.cover(own) == hits[0].s:
		return o.add(ctx, hits[0].s, &hits[0].e, false, in, c)
	}
	merged := own
	for _, h := range hits {
		merged = merged.cover(h.s)
	}
	e, err := o.mergeEntries(ctx, hits)
	if err != nil {
		return err
	}
	for _, h := range hits {
		if err := o.st.windows.Remove(ctx, h.s); err != nil {
			return err
		}
	}
	if err := o.add(ctx, merged, &e, true, in, c); err != nil {
		return err
	}
	needed := func(at int64) bool {
		at = timerTime(at)
		if at == timerTime(merged.end) || at == timerTime(merged.end+o.lateness) {
			return true
		}
		if o.earlyEvery > 0 && at%o.earlyEvery == 0 {
			// Possibly an early timer of the merged session or
			// another; kept, it fires early whatever window of the
			// key changed since it last fired, as that window's own
			// timer at the multiple would.
			return true
		}
		for _, w := range others {
			if !w.e.fired && timerTime(w.s.end) == at || timerTime(w.s.end+o.lateness) == at {
				return true
			}
		}
		return false
	}
	for _, h := range hits {
		for _, at := range [...]int64{h.s.end, h.s.end + o.lateness} {
			if !needed(at) {
				o.unregister(ctx, at)
			}
		}
	}
	return nil
}

// mergeEntries merges the state of sessions (in time order) into the
// entry of the session that replaces them.
func (o *operator[IN, OUT]) mergeEntries(ctx sluice.Context, hits []window) (entry, error) {
	k := 0
	for i, h := range hits {
		if h.e.count > hits[k].e.count {
			k = i
		}
	}
	e := entry{slot: hits[k].e.slot, count: hits[k].e.count}
	if o.fn.incremental() {
		acc := hits[0].e.acc
		for _, h := range hits[1:] {
			var err error
			if acc, err = o.fn.merge(acc, h.e.acc); err != nil {
				return entry{}, err
			}
		}
		e.acc = acc
		for i, h := range hits {
			if i != k {
				e.count += h.e.count
			}
		}
		return e, nil
	}
	for i, h := range hits {
		if i == k {
			continue
		}
		for n := range h.e.count {
			from := elementKey{h.e.slot, n}
			v, ok, err := o.st.elements.Get(ctx, from)
			if err != nil {
				return entry{}, err
			}
			if !ok {
				return entry{}, errors.New("window: an element of a merged session is missing from state")
			}
			if err := o.st.elements.Put(ctx, elementKey{e.slot, e.count}, v); err != nil {
				return entry{}, err
			}
			e.count++
		}
		if err := o.removeElements(ctx, h.e.slot, 0, h.e.count); err != nil {
			return entry{}, err
		}
	}
	return e, nil
}
