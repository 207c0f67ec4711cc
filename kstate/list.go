package kstate

import (
	"encoding/binary"
	"fmt"
)

// ListState is a list of values per record key (Flink's ListState).
//
// The list is stored as one value, each element's encoding prefixed with
// its uvarint length. One entry per list keeps a read to one lookup and an
// epoch's changelog to one record per touched list; Add appends bytes
// without decoding the elements already there.
type ListState[T any] struct {
	d     descriptor
	codec Codec[T]
}

// List declares a list state. It panics if name is empty or c is nil.
func List[T any](name string, c Codec[T], opts ...Option) *ListState[T] {
	d := newDescriptor("list", name, opts)
	mustCodec("list", name, "codec", c)
	return &ListState[T]{d: d, codec: c}
}

// Name returns the state's name.
func (l *ListState[T]) Name() string { return l.d.name }

// Get returns the current key's list, nil if it has none.
func (l *ListState[T]) Get(s Scope) ([]T, error) {
	raw, ok, err := l.d.load(s, l.d.key(s, nil))
	if !ok || err != nil {
		return nil, err
	}
	var out []T
	for len(raw) > 0 {
		elem, rest, err := nextElement(raw)
		if err != nil {
			return nil, l.d.wrap("read", err)
		}
		v, err := decode(&l.d, l.codec, elem)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		raw = rest
	}
	return out, nil
}

// Add appends v to the current key's list.
func (l *ListState[T]) Add(s Scope, v T) error {
	b, err := encode(&l.d, l.codec, v)
	if err != nil {
		return err
	}
	cur, _, err := l.d.load(s, l.d.key(s, nil))
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(cur)+binary.MaxVarintLen64+len(b))
	buf = append(buf, cur...)
	buf = appendElement(buf, b)
	return l.d.save(s, l.d.key(s, nil), buf)
}

// Update replaces the current key's list with vs. An empty vs clears it.
func (l *ListState[T]) Update(s Scope, vs []T) error {
	if len(vs) == 0 {
		return l.Clear(s)
	}
	buf, err := encodeElements(&l.d, l.codec, vs)
	if err != nil {
		return err
	}
	return l.d.save(s, l.d.key(s, nil), buf)
}

// encodeElements is vs as a list's value: each element's encoding
// prefixed with its uvarint length.
func encodeElements[T any](d *descriptor, c Codec[T], vs []T) ([]byte, error) {
	var buf []byte
	for _, v := range vs {
		b, err := encode(d, c, v)
		if err != nil {
			return nil, err
		}
		buf = appendElement(buf, b)
	}
	return buf, nil
}

// Clear deletes the current key's list.
func (l *ListState[T]) Clear(s Scope) error {
	l.d.remove(s, l.d.key(s, nil))
	return nil
}

func appendElement(buf, elem []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(elem)))
	return append(buf, elem...)
}

func nextElement(b []byte) (elem, rest []byte, err error) {
	n, size := binary.Uvarint(b)
	if size <= 0 || n > uint64(len(b)-size) {
		return nil, nil, fmt.Errorf("%w: list element framing", ErrCorrupt)
	}
	b = b[size:]
	return b[:n], b[n:], nil
}
