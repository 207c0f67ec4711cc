package kstate

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
	"time"
)

func TestMetaEncoding(t *testing.T) {
	tests := []Meta{
		{Offsets: map[string]int64{}},
		{Epoch: 1, ChangelogOffset: -1, Offsets: map[string]int64{}},
		{Epoch: 1 << 40, ChangelogOffset: 123456789, Offsets: map[string]int64{"in": 5, "": 0, "other": 1 << 50}},
		{Epoch: 7, ChangelogOffset: 70, Offsets: map[string]int64{"in": 9}, AppliedAt: time.UnixMilli(1764460800123), Partial: true},
		{Epoch: 8, ChangelogOffset: 80, Offsets: map[string]int64{"in": 9}, SinkTxn: "sluice/app/3/8/0a1b"},
		{Epoch: 9, ChangelogOffset: 90, Offsets: map[string]int64{"in": 9}, Watermark: time.UnixMilli(1764460800999), SinkTxn: "sluice/app/3/9/ff"},
	}
	for _, m := range tests {
		b := encodeMeta(m)
		got, err := decodeMeta(b)
		if err != nil {
			t.Fatalf("decodeMeta(encodeMeta(%+v)): %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip: got %+v, want %+v", got, m)
		}
		// Deterministic bytes whatever the map's iteration order.
		if string(encodeMeta(got)) != string(b) {
			t.Errorf("encoding of %+v is not deterministic", m)
		}
	}
}

func TestMetaDecodeRejects(t *testing.T) {
	good := encodeMeta(Meta{Epoch: 3, ChangelogOffset: 9, Offsets: map[string]int64{"in": 7}})
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"unknown format", []byte{9, 0, 0, 0}},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(append([]byte{}, good...), 0)},
		{"huge topic count", []byte{metaFormatV1, 0, 0, 0xff, 0xff, 0x03}},
		{"checksum", flipLastBodyByte(good)},
		{"v2 too short", []byte{metaFormatV2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeMeta(tt.in); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeMeta(%x) = %v, want ErrCorrupt", tt.in, err)
			}
		})
	}
}

// flipLastBodyByte changes an offset byte of an encoded meta, as a bad disk
// would: the checksum must catch it.
func flipLastBodyByte(b []byte) []byte {
	b = append([]byte{}, b...)
	b[len(b)-5] ^= 0x01
	return b
}

// Files written before the checksum (format 1) still open.
func TestMetaDecodesV1(t *testing.T) {
	v1 := []byte{metaFormatV1, 3, 18, 1, 2, 'i', 'n', 14}
	m, err := decodeMeta(v1)
	if err != nil {
		t.Fatal(err)
	}
	want := Meta{Epoch: 3, ChangelogOffset: 9, Offsets: map[string]int64{"in": 7}}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %+v, want %+v", m, want)
	}
}

// Files of format 3 (before the sink transaction) still open; format 3
// with the sink flag set is refused, not misread.
func TestMetaDecodesV3(t *testing.T) {
	want := Meta{Epoch: 3, ChangelogOffset: 9, Offsets: map[string]int64{"in": 7}, Watermark: time.UnixMilli(1764460800123)}
	v3 := asFormat(encodeMeta(want), metaFormatV3)
	m, err := decodeMeta(v3)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	withSink := encodeMeta(Meta{Epoch: 3, Offsets: map[string]int64{}, SinkTxn: "x"})
	if _, err := decodeMeta(asFormat(withSink, metaFormatV3)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("format 3 with the sink flag: %v, want ErrCorrupt", err)
	}
}

// asFormat rewrites an encoded meta's format byte and
// recomputes its checksum.
func asFormat(b []byte, format byte) []byte {
	body := append([]byte{format}, b[1:len(b)-4]...)
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(Meta{Epoch: 3, ChangelogOffset: -1, Offsets: map[string]int64{"in": 7, "x": 0}}))
	f.Add([]byte{metaFormatV1, 0, 0, 0})
	f.Add(encodeMeta(Meta{Epoch: 3, Offsets: map[string]int64{"in": 7}, SinkTxn: "sluice/a/0/3/x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := decodeMeta(encodeMeta(m))
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encoded meta %+v decodes to %+v, %v", m, again, err)
		}
	})
}
