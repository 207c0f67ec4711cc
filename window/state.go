package window

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/kstate"
)

// The state of a window job, per record key (so it moves with its key in
// savepoints and rescaling), under names prefixed with Spec.Name:
//
//	<name>.windows       map: window → entry, the key's live windows
//	<name>.elements      map: (slot, n) → element, full-window functions only
//	<name>.late-dropped  value: records dropped as too late (no LateOutput)
//	<name>.count         value: count windows only, the key's records since
//	                     its numbering last started
//
// and timers of the key, in the assigner's domain, at each window's end
// (firing) and at end + allowed lateness (cleanup). A key with no live
// window has no state left (but for the count of a sliding count window
// whose slide is less than its size, whose windows overlap for good).
//
// A count window's span is in record numbers rather than milliseconds:
// [c-size, c) holds the key's records c-size+1 to c (1-based), and fires
// with record c.

// entry is what the window index keeps per window.
type entry struct {
	// fired: the window's result went out and no element came since. A
	// window that fired stays until its cleanup time so that late
	// elements update it and fire it again.
	fired bool
	// emitted: an early firing (Spec.EarlyInterval, EarlyCount) sent the
	// window's result so far and no element came since, so the next
	// early time has nothing new to fire.
	emitted bool
	// slot is where the window's elements are stored: the window itself,
	// except for a session that absorbed others, which keeps the slot of
	// the one with the most elements so that they need not move (Flink's
	// MergingWindowSet keeps a "state window" for the same reason).
	slot span
	// count is the number of elements added.
	count int64
	// acc is the encoded accumulator of an incremental function.
	acc []byte
	// times spans the Kafka times of a count window's elements, the
	// smallest to the largest + 1 ms (flagTimes); windows of time have
	// none.
	times span
	timed bool
}

// entryFormat versions the encoding of entry, which is durable state.
const entryFormat byte = 1

const (
	flagFired   byte = 1
	flagEmitted byte = 2 // a reader without it ignores it: no format change
	// flagTimes: the entry's times follow its count. Only count windows
	// have them, which no reader before them reads.
	flagTimes byte = 4
)

// entryCodec encodes an entry as
//
//	[format][flags][slot: 16 bytes][uvarint count][times: 16 bytes if flagTimes][accumulator...]
type entryCodec struct{}

func (entryCodec) Encode(e entry) ([]byte, error) {
	b := make([]byte, 0, 2+2*spanLen+binary.MaxVarintLen64+len(e.acc))
	var flags byte
	if e.fired {
		flags |= flagFired
	}
	if e.emitted {
		flags |= flagEmitted
	}
	if e.timed {
		flags |= flagTimes
	}
	b = append(b, entryFormat, flags)
	b = appendSpan(b, e.slot)
	b = binary.AppendUvarint(b, uint64(e.count))
	if e.timed {
		b = appendSpan(b, e.times)
	}
	return append(b, e.acc...), nil
}

func (entryCodec) Decode(b []byte) (entry, error) {
	if len(b) < 2+spanLen+1 || b[0] != entryFormat {
		return entry{}, errors.New("window: malformed window entry")
	}
	slot, err := decodeSpan(b[2:])
	if err != nil {
		return entry{}, err
	}
	n, size := binary.Uvarint(b[2+spanLen:])
	if size <= 0 {
		return entry{}, errors.New("window: malformed window entry count")
	}
	e := entry{fired: b[1]&flagFired != 0, emitted: b[1]&flagEmitted != 0, slot: slot, count: int64(n)}
	rest := b[2+spanLen+size:]
	if b[1]&flagTimes != 0 {
		if e.times, err = decodeSpan(rest); err != nil {
			return entry{}, err
		}
		e.timed, rest = true, rest[spanLen:]
	}
	if len(rest) > 0 {
		// A copy: Decode must not retain the store's bytes.
		e.acc = append([]byte(nil), rest...)
	}
	return e, nil
}

// elementKey addresses one stored element: its window's slot and its
// position in it.
type elementKey struct {
	slot span
	n    int64
}

type elementKeyCodec struct{}

func (elementKeyCodec) Encode(k elementKey) ([]byte, error) {
	return binary.BigEndian.AppendUint64(appendSpan(make([]byte, 0, spanLen+8), k.slot), uint64(k.n)), nil
}

func (elementKeyCodec) Decode(b []byte) (elementKey, error) {
	if len(b) != spanLen+8 {
		return elementKey{}, fmt.Errorf("window: element key of %d bytes, want %d", len(b), spanLen+8)
	}
	s, err := decodeSpan(b)
	return elementKey{slot: s, n: int64(binary.BigEndian.Uint64(b[spanLen:]))}, err
}

// stores are a job's state descriptors.
type stores[IN any] struct {
	windows  *kstate.MapState[span, entry]
	elements *kstate.MapState[elementKey, IN] // nil for incremental functions
	dropped  *kstate.ValueState[int64]
	seen     *kstate.ValueState[int64] // count windows: the key's records since its numbering started
}

func newStores[IN any](name string, elements kstate.Codec[IN]) stores[IN] {
	s := stores[IN]{
		windows: kstate.Map[span, entry](name+".windows", spanCodec{}, entryCodec{}),
		dropped: kstate.Value[int64](name+".late-dropped", kstate.Int64()),
		seen:    kstate.Value[int64](name+".count", kstate.Int64()),
	}
	if elements != nil {
		s.elements = kstate.Map[elementKey, IN](name+".elements", elementKeyCodec{}, elements)
	}
	return s
}
