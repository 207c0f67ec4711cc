package kstate

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Broadcast entries are operator entries too (KindOperator): the tail is
// OperatorBroadcast and the map key, or OperatorPosition and a partition of
// the broadcast topic (4 bytes, big endian) whose value is the next offset
// the task will apply (8 bytes, big endian).
const (
	OperatorBroadcast byte = 'b'
	OperatorPosition  byte = 'p'
)

// PositionState is the name of the entries that hold a task's read
// position in the broadcast topic.
const PositionState = "sluice.broadcast-position"

// ErrBroadcastReadOnly is returned by BroadcastState's writes outside the
// handler of the broadcast stream: only it may change the table, so that
// every task's copy is the same function of the same records.
var ErrBroadcastReadOnly = errors.New("kstate: broadcast state is read-only outside the broadcast handler")

// broadcasting reports whether s says the broadcast stream is being
// handled: sluice's Context does, with a Broadcasting method.
func broadcasting(s Scope) bool {
	b, ok := s.(interface{ Broadcasting() bool })
	return ok && b.Broadcasting()
}

// BroadcastState is a map every task holds a copy of, written only from
// the broadcast stream (Flink's broadcast state, Kafka Streams' global
// table): each task applies every broadcast record in its own epochs, so
// its copy, and how far in the stream it is, commit with what it output.
type BroadcastState[V any] struct {
	d     descriptor
	codec Codec[V]
}

// Broadcast declares a broadcast map.
func Broadcast[V any](name string, c Codec[V]) *BroadcastState[V] {
	d := newDescriptor("broadcast", name, nil)
	d.kind = KindOperator
	mustCodec("broadcast", name, "codec", c)
	return &BroadcastState[V]{d: d, codec: c}
}

// Name returns the state's name.
func (b *BroadcastState[V]) Name() string { return b.d.name }

func (b *BroadcastState[V]) key(k string) []byte {
	return EncodeKey(KindOperator, b.d.name, nil, append([]byte{OperatorBroadcast}, k...))
}

// Get returns the task's value of key.
func (b *BroadcastState[V]) Get(s Scope, key string) (V, bool, error) {
	var zero V
	raw, ok, err := s.Store().Get(b.key(key))
	if !ok || err != nil {
		return zero, false, b.d.wrap("read", err)
	}
	v, err := decode(&b.d, b.codec, raw)
	return v, err == nil, err
}

// Put sets key to v; only the broadcast handler may (ErrBroadcastReadOnly,
// which also fails the record).
func (b *BroadcastState[V]) Put(s Scope, key string, v V) error {
	if !broadcasting(s) {
		s.Store().fail(ErrBroadcastReadOnly)
		return b.d.wrap("write", ErrBroadcastReadOnly)
	}
	raw, err := encode(&b.d, b.codec, v)
	if err != nil {
		return err
	}
	return b.d.save(s, b.key(key), raw)
}

// Delete removes key; only the broadcast handler may.
func (b *BroadcastState[V]) Delete(s Scope, key string) error {
	if !broadcasting(s) {
		s.Store().fail(ErrBroadcastReadOnly)
		return b.d.wrap("delete", ErrBroadcastReadOnly)
	}
	s.Store().Delete(b.key(key))
	return nil
}

// Range calls fn for every entry of the task's copy, in key order.
func (b *BroadcastState[V]) Range(s Scope, fn func(key string, v V) error) error {
	prefix := EncodeKey(KindOperator, b.d.name, nil, []byte{OperatorBroadcast})
	err := s.Store().Scan(prefix, func(k, raw []byte) error {
		v, err := decode(&b.d, b.codec, raw)
		if err != nil {
			return err
		}
		return fn(string(k[len(prefix):]), v)
	})
	return b.d.wrap("range", err)
}

// PositionKey is the key of a task's read position in partition p of the
// broadcast topic.
func PositionKey(p int32) []byte {
	return EncodeKey(KindOperator, PositionState, nil, binary.BigEndian.AppendUint32([]byte{OperatorPosition}, uint32(p)))
}

// EncodePosition and DecodePosition are a position entry's value.
func EncodePosition(next int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(next)) }

func DecodePosition(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: broadcast position of %d bytes", ErrCorrupt, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}
