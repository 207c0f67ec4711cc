package kstate

import (
	"encoding/binary"
	"fmt"
)

// FormatV1 is the first byte of every physical key. It versions the layout
// below so that a later format can live next to this one in the same
// changelog topic and be told apart record by record.
const FormatV1 byte = 1

// Kind says what a physical key addresses. It is the second byte of the key,
// so all entries of one kind are contiguous in a backend's key order.
type Kind byte

// The kinds of physical key.
const (
	// KindKeyed is a keyed state entry: a state name, the record key it is
	// scoped to, and for map state the encoded map key. The value is the
	// codec's bytes (a list's framed elements for list state).
	KindKeyed Kind = 1
	// KindTimer is a registered timer (event or processing time).
	KindTimer Kind = 2
	// KindOperator is per-task operator state.
	KindOperator Kind = 3
	// KindMarker is the changelog's epoch marker. The changelog package uses
	// it as a record key; it is never stored as a backend entry.
	KindMarker Kind = 4
	// KindKeyedTTL is a keyed state entry of a state declared WithTTL: the
	// same name, record key and tail as KindKeyed, but the value starts
	// with the 8-byte big-endian expiry (unix milliseconds). The kind is
	// what tells a reader of the raw entries, such as SweepExpired, which
	// values carry that header; a separate kind also keeps all entries with
	// TTL in one contiguous range, so a sweep walks only them.
	KindKeyedTTL Kind = 5
)

// String returns the kind's name, for logs and error messages.
func (k Kind) String() string {
	switch k {
	case KindKeyed:
		return "keyed"
	case KindTimer:
		return "timer"
	case KindOperator:
		return "operator"
	case KindMarker:
		return "marker"
	case KindKeyedTTL:
		return "keyed-ttl"
	}
	return fmt.Sprintf("Kind(%d)", byte(k))
}

func (k Kind) valid() bool { return k >= KindKeyed && k <= KindKeyedTTL }

// MaxKeySize is the longest physical key a Store accepts. It is bbolt's
// limit, enforced for every backend so that state written with the memory
// backend can always be restored into bbolt.
const MaxKeySize = 32768

// Key is a decoded physical key.
type Key struct {
	Kind    Kind
	Name    string // state name; "" for timers
	UserKey []byte // the record key the entry is scoped to; nil when empty
	Sub     []byte // the tail: encoded map key or timer sub-key; nil when empty
}

// EncodeKey returns the physical key
//
//	[FormatV1][kind][uvarint len(name)][name][uvarint len(userKey)][userKey][sub...]
//
// The same bytes are the backend key and the changelog record key.
//
// Name and user key are length-prefixed and sub is the unprefixed tail, so
// EncodeKey(kind, name, userKey, nil) is a prefix of exactly the keys with
// that kind, name and user key: a map's entries for one record key are one
// contiguous range, whatever bytes the names and keys contain. Likewise
// [FormatV1][kind] is a prefix of exactly the keys of that kind, which is
// how SweepExpired finds the entries with TTL without reading the others.
func EncodeKey(kind Kind, name string, userKey, sub []byte) []byte {
	return AppendKey(make([]byte, 0, keyLen(name, userKey, sub)), kind, name, userKey, sub)
}

// AppendKey appends the physical key of EncodeKey to dst and returns the
// extended slice, so hot paths can reuse a buffer.
func AppendKey(dst []byte, kind Kind, name string, userKey, sub []byte) []byte {
	dst = append(dst, FormatV1, byte(kind))
	dst = binary.AppendUvarint(dst, uint64(len(name)))
	dst = append(dst, name...)
	dst = binary.AppendUvarint(dst, uint64(len(userKey)))
	dst = append(dst, userKey...)
	return append(dst, sub...)
}

func keyLen(name string, userKey, sub []byte) int {
	return 2 + uvarintLen(uint64(len(name))) + len(name) +
		uvarintLen(uint64(len(userKey))) + len(userKey) + len(sub)
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// DecodeKey parses a physical key. It is strict: an unknown format byte or
// kind, a truncated or non-minimal varint, or a length past the end of b is
// an error wrapping ErrBadKey. Strictness makes the encoding canonical: for
// every b that decodes, EncodeKey of the result returns b again, so a key
// read from the changelog and written back never changes identity.
//
// UserKey and Sub alias b; copy them to keep them past b's lifetime.
func DecodeKey(b []byte) (Key, error) {
	if len(b) < 2 {
		return Key{}, fmt.Errorf("%w: %d bytes, want at least 2", ErrBadKey, len(b))
	}
	if b[0] != FormatV1 {
		return Key{}, fmt.Errorf("%w: unknown format byte %d", ErrBadKey, b[0])
	}
	k := Key{Kind: Kind(b[1])}
	if !k.Kind.valid() {
		return Key{}, fmt.Errorf("%w: unknown kind %d", ErrBadKey, b[1])
	}
	rest := b[2:]
	name, rest, err := lengthPrefixed(rest, "name")
	if err != nil {
		return Key{}, err
	}
	userKey, rest, err := lengthPrefixed(rest, "user key")
	if err != nil {
		return Key{}, err
	}
	k.Name = string(name)
	if len(userKey) > 0 {
		k.UserKey = userKey
	}
	if len(rest) > 0 {
		k.Sub = rest
	}
	return k, nil
}

// lengthPrefixed splits a uvarint-length-prefixed field off the front of b.
func lengthPrefixed(b []byte, field string) (value, rest []byte, err error) {
	n, size := binary.Uvarint(b)
	if size <= 0 {
		return nil, nil, fmt.Errorf("%w: truncated or overflowing %s length", ErrBadKey, field)
	}
	if size != uvarintLen(n) {
		return nil, nil, fmt.Errorf("%w: non-minimal %s length varint", ErrBadKey, field)
	}
	b = b[size:]
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: %s length %d past the end (%d bytes left)", ErrBadKey, field, n, len(b))
	}
	return b[:n], b[n:], nil
}
