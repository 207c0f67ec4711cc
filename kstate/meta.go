package kstate

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// metaFormatV1 versions the binary encoding of Meta inside a backend file,
// so a later release can read files written by this one.
const metaFormatV1 byte = 1

// encodeMeta returns
//
//	[metaFormatV1][uvarint epoch][varint changelogOffset][uvarint n]
//	n × ([uvarint len(topic)][topic][varint offset])
//
// with topics sorted, so the same Meta always encodes to the same bytes.
func encodeMeta(m Meta) []byte {
	b := []byte{metaFormatV1}
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendVarint(b, m.ChangelogOffset)
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
	return b
}

func decodeMeta(b []byte) (Meta, error) {
	if len(b) == 0 || b[0] != metaFormatV1 {
		return Meta{}, fmt.Errorf("%w: meta: unknown format", ErrCorrupt)
	}
	r := byteReader{b: b[1:], what: "meta"}
	m := Meta{Epoch: r.uvarint(), ChangelogOffset: r.varint()}
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

func encodeStats(s Stats) []byte {
	b := binary.AppendUvarint(nil, uint64(s.Keys))
	return binary.AppendUvarint(b, uint64(s.Bytes))
}

func decodeStats(b []byte) (Stats, error) {
	r := byteReader{b: b, what: "stats"}
	s := Stats{Keys: int64(r.uvarint()), Bytes: int64(r.uvarint())}
	return s, r.err
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
