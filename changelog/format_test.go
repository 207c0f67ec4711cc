package changelog

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
)

func TestMarkerRoundTrip(t *testing.T) {
	for _, m := range []Marker{
		{Epoch: 0, Offsets: map[string]int64{}},
		{Epoch: 1, Offsets: map[string]int64{"in": 0}},
		{Epoch: 1 << 60, Offsets: map[string]int64{"a": 12345678901, "b": 7, "c-long.topic_name": -1}},
		{Epoch: 9, Offsets: map[string]int64{"in": 3}, Job: "aggregate", SinkTxn: "sluice/app/3/9/0"},
	} {
		got, err := DecodeMarker(EncodeMarker(m))
		if err != nil {
			t.Fatalf("decode %+v: %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip: got %+v want %+v", got, m)
		}
	}
}

func TestDecodeMarkerRejects(t *testing.T) {
	good := EncodeMarker(Marker{Epoch: 3, Offsets: map[string]int64{"in": 10}})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"format":    append([]byte{9}, good[1:]...),
		"truncate":  good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"count":     {markerFormat, 1, 200},
		"duplicate": EncodeMarkerRaw(t, 1, []string{"a", "a"}),
	} {
		if _, err := DecodeMarker(b); !errors.Is(err, ErrBadMarker) {
			t.Errorf("%s: err = %v, want ErrBadMarker", name, err)
		}
	}
}

// Markers written by earlier releases still decode, with no job or sink
// transaction.
func TestDecodeMarkerFormat2(t *testing.T) {
	// Format 2: epoch 7, one topic "in" at 5, watermark 1000 ms.
	b := []byte{markerFormatV2, 7, 1, 2, 'i', 'n', 10, 1, 0xd0, 0x0f}
	got, err := DecodeMarker(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Marker{Epoch: 7, Offsets: map[string]int64{"in": 5}, Watermark: time.UnixMilli(1000)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v want %+v", got, want)
	}
}

// EncodeMarkerRaw builds a marker with possibly repeated topics.
func EncodeMarkerRaw(t *testing.T, epoch byte, topics []string) []byte {
	t.Helper()
	b := []byte{markerFormat, epoch, byte(len(topics))}
	for _, tp := range topics {
		b = append(b, byte(len(tp)))
		b = append(b, tp...)
		b = append(b, 2)
	}
	return b
}

func TestIsMarker(t *testing.T) {
	if !IsMarker(MarkerKey) {
		t.Fatal("MarkerKey is not a marker")
	}
	if IsMarker(kstate.EncodeKey(kstate.KindKeyed, "count", []byte("k"), nil)) {
		t.Fatal("keyed entry taken for a marker")
	}
}

func FuzzDecodeMarker(f *testing.F) {
	f.Add(EncodeMarker(Marker{Epoch: 5, Offsets: map[string]int64{"in": 42, "other": 7}}))
	f.Add([]byte{markerFormat, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMarker(b)
		if err != nil {
			return
		}
		// A value that decodes re-encodes to a value that decodes the
		// same, and never longer (the encoding is minimal and sorted).
		enc := EncodeMarker(m)
		again, err := DecodeMarker(enc)
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encode of %x: %+v, %v", b, again, err)
		}
		if b[0] == markerFormat && len(enc) > len(b) {
			t.Fatalf("canonical encoding %x longer than input %x", enc, b)
		}
		if !bytes.Equal(EncodeMarker(again), enc) {
			t.Fatalf("encoding not stable: %x", enc)
		}
	})
}
