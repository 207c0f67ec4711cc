package kstate

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

// Codec turns state values into bytes and back. The bytes are what the
// backend stores and the changelog carries, so a codec's encoding is part of
// a job's durable format: change it only with a migration.
//
// Decode must not retain or modify its input: the bytes may belong to the
// Store's write-set.
type Codec[T any] interface {
	Encode(T) ([]byte, error)
	Decode([]byte) (T, error)
}

// AppendCodec is a Codec that can also encode by appending to a buffer, as
// strconv.AppendInt and binary.BigEndian.AppendUint64 do: AppendEncode
// appends v's encoding to dst and returns the extended slice (the same
// bytes Encode returns). A Store then encodes straight into memory of its
// own, so writing such state allocates nothing: worth it for hot state.
// Value, Reducing, Aggregating and Map values use it when their codec has
// it (and no TTL is set); Int64, Float64, String and Bytes have it.
type AppendCodec[T any] interface {
	Codec[T]
	AppendEncode(dst []byte, v T) ([]byte, error)
}

// JSON returns a codec that stores values as encoding/json. It is the easy
// default for structs; prefer a fixed-width codec for hot numeric state.
func JSON[T any]() Codec[T] { return jsonCodec[T]{} }

type jsonCodec[T any] struct{}

func (jsonCodec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }

func (jsonCodec[T]) Decode(b []byte) (T, error) {
	var v T
	err := json.Unmarshal(b, &v)
	return v, err
}

// Bytes returns the identity codec for raw bytes. Decode returns a copy, so
// callers may modify it without touching stored state.
func Bytes() Codec[[]byte] { return bytesCodec{} }

type bytesCodec struct{}

func (bytesCodec) Encode(v []byte) ([]byte, error)            { return v, nil }
func (bytesCodec) AppendEncode(dst, v []byte) ([]byte, error) { return append(dst, v...), nil }
func (bytesCodec) Decode(b []byte) ([]byte, error)            { return append([]byte{}, b...), nil }

// String returns the codec that stores a string as its bytes.
func String() Codec[string] { return stringCodec{} }

type stringCodec struct{}

func (stringCodec) Encode(v string) ([]byte, error) { return []byte(v), nil }
func (stringCodec) AppendEncode(dst []byte, v string) ([]byte, error) {
	return append(dst, v...), nil
}
func (stringCodec) Decode(b []byte) (string, error) { return string(b), nil }

// Int64 returns the codec that stores an int64 as 8 big-endian bytes (two's
// complement). As map keys, non-negative values iterate in numeric order,
// and negative values after them.
func Int64() Codec[int64] { return int64Codec{} }

type int64Codec struct{}

func (int64Codec) Encode(v int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(v)), nil
}

func (int64Codec) AppendEncode(dst []byte, v int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(dst, uint64(v)), nil
}

func (int64Codec) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("int64 codec: %d bytes, want 8", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// Float64 returns the codec that stores a float64 as its IEEE 754 bits, 8
// big-endian bytes.
func Float64() Codec[float64] { return float64Codec{} }

type float64Codec struct{}

func (float64Codec) Encode(v float64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, math.Float64bits(v)), nil
}

func (float64Codec) AppendEncode(dst []byte, v float64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(v)), nil
}

func (float64Codec) Decode(b []byte) (float64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("float64 codec: %d bytes, want 8", len(b))
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
}
