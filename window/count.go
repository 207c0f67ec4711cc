package window

import "github.com/sluicehq/sluice"

// Count windows (TumblingCount, SlidingCount) number a key's records 1, 2,
// … in the order they are processed. The window that fires with record c
// (c a multiple of the slide) holds the records after c-size up to c; its
// span in the window index is [c-size, c) in record numbers. A record n
// joins every window c with n <= c < n+size, so windows need no timer: a
// record fires the one window it completes, if any, in its own
// processing. That makes the firing part of the record's processing: if
// the window function or Encode fails, the record fails (dead-lettered,
// as any record whose Process fails) and its window, which it no longer
// completes, waits for the key's next record.

// addToCounts adds in, the key's next record, to the count windows it
// belongs to and fires the one it completes.
func (o *operator[IN, OUT]) addToCounts(ctx sluice.Context, in IN) error {
	size, slide := o.assigner.size, o.assigner.slide
	seen, _, err := o.st.seen.Get(ctx)
	if err != nil {
		return err
	}
	n := seen + 1
	t := ctx.Timestamp().UnixMilli()
	for c := ceilTo(n, slide); c < n+size; c += slide {
		s := span{c - size, c}
		e, ok, err := o.st.windows.Get(ctx, s)
		if err != nil {
			return err
		}
		if !ok {
			e = entry{slot: s, timed: true, times: span{t, t + 1}}
		}
		e.times = span{min(e.times.start, t), max(e.times.end, t+1)}
		if err := o.addElement(ctx, &e, in); err != nil {
			return err
		}
		if c != n {
			if err := o.st.windows.Put(ctx, s, e); err != nil {
				return err
			}
			continue
		}
		w := window{s, e}
		if err := o.fire(ctx, w); err != nil {
			return err
		}
		if err := o.clear(ctx, w); err != nil {
			return err
		}
	}
	// A key whose windows do not overlap (slide >= size) has none open
	// once one fires: its numbering starts again, and it keeps no state.
	if n%slide == 0 && slide >= size {
		return o.st.seen.Clear(ctx)
	}
	return o.st.seen.Set(ctx, n)
}

// ceilTo is the first multiple of m at or after n (n, m > 0).
func ceilTo(n, m int64) int64 { return (n + m - 1) / m * m }
