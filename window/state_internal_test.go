package window

import (
	"reflect"
	"testing"
)

// Entries round-trip, with a count window's times and without; an entry
// cut short anywhere is an error, never a panic or another entry.
func TestEntryCodec(t *testing.T) {
	for _, e := range []entry{
		{slot: span{-5, 10}, count: 3, acc: []byte("acc")},
		{fired: true, emitted: true, slot: span{0, 1 << 40}},
		{slot: countSlot, count: 300, acc: []byte{1, 2}, timed: true, times: span{-1, 1_700_000_000_001}},
		{slot: countSlot, timed: true, times: span{7, 8}},
	} {
		b, err := entryCodec{}.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := entryCodec{}.Decode(b)
		if err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("%+v: decoded %+v, %v", e, got, err)
		}
		for n := range len(b) {
			cut, err := entryCodec{}.Decode(b[:n])
			if err == nil && e.timed && n < 2+spanLen+1+spanLen {
				t.Fatalf("%+v cut to %d bytes: decoded %+v", e, n, cut)
			}
		}
	}
	// An entry of a time window written before count windows (no
	// flagTimes) reads as it did: the bytes after the count are its
	// accumulator.
	old := append([]byte{entryFormat, flagFired}, appendSpan(nil, span{1, 2})...)
	old = append(old, 2, 'a', 'b')
	got, err := entryCodec{}.Decode(old)
	if want := (entry{fired: true, slot: span{1, 2}, count: 2, acc: []byte("ab")}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("an older entry: %+v, %v; want %+v", got, err, want)
	}
}
