package kstate

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// Meta formats inside a backend file. V2 adds the time of the apply, the
// partial flag and a checksum; V3 the watermark; V4 the epoch's sink
// transaction. Older files are still read.
const (
	metaFormatV1 byte = 1
	metaFormatV2 byte = 2
	metaFormatV3 byte = 3
	metaFormatV4 byte = 4
)

// Meta flags (V2 and later).
const (
	metaPartial      byte = 1 << 0
	metaHasWatermark byte = 1 << 1 // V3: a varint watermark follows the flags
	metaHasSinkTxn   byte = 1 << 2 // V4: a sink transaction id follows the watermark
)

// encodeMeta returns
//
//	[metaFormatV4][uvarint epoch][varint changelogOffset]
//	[varint appliedAt, unix milliseconds, 0 = unknown]
//	[flags: bit 0 partial, bit 1 watermark, bit 2 sink txn]
//	[varint watermark, unix ms, if bit 1][uvarint len][sink txn, if bit 2]
//	[uvarint n] n × ([uvarint len(topic)][topic][varint offset])
//	[crc32c of everything before, big endian]
//
// with topics sorted, so the same Meta always encodes to the same bytes.
// The checksum catches a meta whose bytes changed on disk: the meta decides
// where restores resume, so a silently wrong one would lose or repeat state.
func encodeMeta(m Meta) []byte {
	b := []byte{metaFormatV4}
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendVarint(b, m.ChangelogOffset)
	var at int64
	if !m.AppliedAt.IsZero() {
		at = m.AppliedAt.UnixMilli()
	}
	b = binary.AppendVarint(b, at)
	var flags byte
	if m.Partial {
		flags |= metaPartial
	}
	if !m.Watermark.IsZero() {
		flags |= metaHasWatermark
	}
	if m.SinkTxn != "" {
		flags |= metaHasSinkTxn
	}
	b = append(b, flags)
	if !m.Watermark.IsZero() {
		b = binary.AppendVarint(b, m.Watermark.UnixMilli())
	}
	if m.SinkTxn != "" {
		b = binary.AppendUvarint(b, uint64(len(m.SinkTxn)))
		b = append(b, m.SinkTxn...)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Offsets)))
	topics := make([]string, 0, len(m.Offsets))
	for t := range m.Offsets {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	for _, t := range topics {
		b = binary.AppendUvarint(b, uint64(len(t)))
		b = append(b, t...)
		b = binary.AppendVarint(b, m.Offsets[t])
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func decodeMeta(b []byte) (Meta, error) {
	if len(b) == 0 || b[0] < metaFormatV1 || b[0] > metaFormatV4 {
		return Meta{}, fmt.Errorf("%w: meta: unknown format", ErrCorrupt)
	}
	format := b[0]
	v2 := format >= metaFormatV2
	if v2 {
		if len(b) < 5 {
			return Meta{}, fmt.Errorf("%w: meta: %d bytes", ErrCorrupt, len(b))
		}
		body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
		if crc32.Checksum(body, castagnoli) != sum {
			return Meta{}, fmt.Errorf("%w: meta: checksum mismatch", ErrCorrupt)
		}
		b = body
	}
	r := byteReader{b: b[1:], what: "meta"}
	m := Meta{Epoch: r.uvarint(), ChangelogOffset: r.varint()}
	if v2 {
		if at := r.varint(); at != 0 {
			m.AppliedAt = time.UnixMilli(at)
		}
		flags := r.byte()
		known := metaPartial
		if format >= metaFormatV3 {
			known |= metaHasWatermark
		}
		if format >= metaFormatV4 {
			known |= metaHasSinkTxn
		}
		if flags&^known != 0 && r.err == nil {
			r.err = fmt.Errorf("%w: meta: unknown flags %#x", ErrCorrupt, flags)
		}
		m.Partial = flags&metaPartial != 0
		if flags&metaHasWatermark != 0 {
			m.Watermark = time.UnixMilli(r.varint())
		}
		if flags&metaHasSinkTxn != 0 {
			m.SinkTxn = string(r.bytes())
		}
	}
	n := r.uvarint()
	// Each topic takes at least two bytes, which bounds the map size by the
	// input instead of trusting a corrupt count.
	if n > uint64(len(r.b)) {
		return Meta{}, fmt.Errorf("%w: meta: %d topics in %d bytes", ErrCorrupt, n, len(r.b))
	}
	m.Offsets = make(map[string]int64, n)
	for range n {
		t := string(r.bytes())
		m.Offsets[t] = r.varint()
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: meta: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	if r.err != nil {
		return Meta{}, r.err
	}
	return m, nil
}

// encodeStats returns [uvarint keys][uvarint bytes][uvarint event
// timers][uvarint processing timers].
func encodeStats(s Stats) []byte {
	b := binary.AppendUvarint(nil, uint64(s.Keys))
	b = binary.AppendUvarint(b, uint64(s.Bytes))
	b = binary.AppendUvarint(b, uint64(s.EventTimers))
	return binary.AppendUvarint(b, uint64(s.ProcessingTimers))
}

// decodeStats decodes encodeStats, or the older form without the timer
// counts: timers reports whether they were there.
func decodeStats(b []byte) (s Stats, timers bool, err error) {
	r := byteReader{b: b, what: "stats"}
	s = Stats{Keys: int64(r.uvarint()), Bytes: int64(r.uvarint())}
	if r.err == nil && len(r.b) > 0 {
		s.EventTimers, s.ProcessingTimers = int64(r.uvarint()), int64(r.uvarint())
		timers = true
	}
	return s, timers, r.err
}

// byteReader decodes varint fields and remembers the first error, so decoders
// read straight through and check once.
type byteReader struct {
	b    []byte
	what string
	err  error
}

func (r *byteReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: %s: bad uvarint", ErrCorrupt, r.what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *byteReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: %s: bad varint", ErrCorrupt, r.what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *byteReader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = fmt.Errorf("%w: %s: truncated", ErrCorrupt, r.what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *byteReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: %s: length %d past the end", ErrCorrupt, r.what, n)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
