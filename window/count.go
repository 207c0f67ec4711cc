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
//
// An incremental function keeps an accumulator in each open window's
// entry. A full-window function (Process) stores each record once, under
// countSlot and its number, however many windows hold it; a firing reads
// the window's records by number and removes those no later window
// holds.

// countSlot is the slot of a count window's elements: one per key, since
// the elements are numbered by the key's records rather than per window.
var countSlot = span{}

// maxCount bounds a count window's size and slide, so that record numbers
// and window ends never overflow.
const maxCount = 1 << 31

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
	stored := false
	for c := ceilTo(n, slide); c < n+size; c += slide {
		s := span{c - size, c}
		e, ok, err := o.st.windows.Get(ctx, s)
		if err != nil {
			return err
		}
		if !ok {
			e = entry{slot: countSlot, timed: true, times: span{t, t + 1}}
		}
		e.times = span{min(e.times.start, t), max(e.times.end, t+1)}
		switch {
		case o.fn.incremental():
			if err := o.addElement(ctx, &e, in); err != nil {
				return err
			}
		case !stored:
			if err := o.st.elements.Put(ctx, elementKey{countSlot, n}, in); err != nil {
				return err
			}
			stored = true
			fallthrough
		default:
			e.count++
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
		if err := o.clearCount(ctx, w); err != nil {
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

// countElements returns the elements of count window w, records c-count+1
// to c of its key, c its end.
func (o *operator[IN, OUT]) countElements(ctx sluice.Context, w window) ([]IN, error) {
	c := w.s.end
	return o.readElements(ctx, countSlot, c-w.e.count+1, c+1)
}

// clearCount removes count window w, which fired, and the elements that
// no later window holds: those up to c+slide-size, the next window's
// first being c+slide-size+1.
func (o *operator[IN, OUT]) clearCount(ctx sluice.Context, w window) error {
	if err := o.st.windows.Remove(ctx, w.s); err != nil {
		return err
	}
	if o.fn.incremental() {
		return nil
	}
	c := w.s.end
	// With slide > size the records after c are in no window yet, and
	// none was stored: nothing past c to remove.
	for n := c - w.e.count + 1; n <= min(c, c+o.assigner.slide-o.assigner.size); n++ {
		if err := o.st.elements.Remove(ctx, elementKey{countSlot, n}); err != nil {
			return err
		}
	}
	return nil
}

// ceilTo is the first multiple of m at or after n (n, m > 0).
func ceilTo(n, m int64) int64 { return (n + m - 1) / m * m }
