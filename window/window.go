package window

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Window is a half-open span of time [Start, End): a record with timestamp
// t belongs to it when Start <= t < End. Both are at millisecond precision,
// in UTC.
type Window struct {
	Start, End time.Time
}

// MaxTimestamp is the last millisecond that belongs to the window, End − 1
// ms, as in Flink.
func (w Window) MaxTimestamp() time.Time { return w.End.Add(-time.Millisecond) }

// String formats the window as [start, end) in RFC 3339.
func (w Window) String() string {
	return fmt.Sprintf("[%s, %s)", w.Start.Format(time.RFC3339Nano), w.End.Format(time.RFC3339Nano))
}

// span is a window in unix milliseconds, the form all arithmetic and the
// stored keys use.
type span struct{ start, end int64 }

func (s span) window() Window {
	return Window{Start: time.UnixMilli(s.start).UTC(), End: time.UnixMilli(s.end).UTC()}
}

// intersects is Flink's TimeWindow.intersects: windows that overlap or
// touch (one's end is the other's start) merge.
func (s span) intersects(o span) bool { return s.start <= o.end && o.start <= s.end }

// cover is the smallest span holding both.
func (s span) cover(o span) span { return span{min(s.start, o.start), max(s.end, o.end)} }

// spanLen is the length of an encoded span.
const spanLen = 16

// appendSpan encodes s as two 8-byte big-endian numbers with the sign bit
// flipped, so that encoded spans sort by start and then end in byte order,
// negative times included: the window index then iterates in time order.
func appendSpan(dst []byte, s span) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(s.start)^1<<63)
	return binary.BigEndian.AppendUint64(dst, uint64(s.end)^1<<63)
}

func decodeSpan(b []byte) (span, error) {
	if len(b) < spanLen {
		return span{}, fmt.Errorf("window: encoded window of %d bytes, want %d", len(b), spanLen)
	}
	return span{
		start: int64(binary.BigEndian.Uint64(b) ^ 1<<63),
		end:   int64(binary.BigEndian.Uint64(b[8:]) ^ 1<<63),
	}, nil
}

// spanCodec is the key codec of the window index (kstate.Codec[span]).
type spanCodec struct{}

func (spanCodec) Encode(s span) ([]byte, error) { return appendSpan(nil, s), nil }
func (spanCodec) Decode(b []byte) (span, error) {
	if len(b) != spanLen {
		return span{}, fmt.Errorf("window: encoded window of %d bytes, want %d", len(b), spanLen)
	}
	return decodeSpan(b)
}
