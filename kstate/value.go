package kstate

import (
	"bytes"
	"fmt"
)

// ValueState is a single value per record key (Flink's ValueState).
type ValueState[T any] struct {
	d     descriptor
	codec Codec[T]
}

// Value declares a value state. Declare it once, for example as a package
// variable of the job:
//
//	var count = kstate.Value("count", kstate.Int64())
//
// Value panics if name is empty or c is nil.
func Value[T any](name string, c Codec[T], opts ...Option) *ValueState[T] {
	d := newDescriptor("value", name, opts)
	mustCodec("value", name, "codec", c)
	return &ValueState[T]{d: d, codec: c}
}

// Name returns the state's name.
func (v *ValueState[T]) Name() string { return v.d.name }

// Get returns the current key's value, or false if it has none.
func (v *ValueState[T]) Get(s Scope) (T, bool, error) {
	var zero T
	raw, ok, err := v.d.load(s, v.d.key(s, nil))
	if !ok || err != nil {
		return zero, false, err
	}
	val, err := decode(&v.d, v.codec, raw)
	if err != nil {
		return zero, false, err
	}
	return val, true, nil
}

// Set replaces the current key's value.
func (v *ValueState[T]) Set(s Scope, val T) error {
	return saveValue(s, &v.d, v.codec, v.d.key(s, nil), val)
}

// Clear deletes the current key's value.
func (v *ValueState[T]) Clear(s Scope) error {
	v.d.remove(s, v.d.key(s, nil))
	return nil
}

// All calls fn with every record key of the store that has a value, and
// its value: the task's whole state of this name, whatever the scope's
// key (Kafka Streams' store.all()). Keys come in the store's order: by
// the key's length as a uvarint, then by bytes (for keys under 128 bytes,
// shorter keys first). Expired values are skipped (and, in a job's scope,
// deleted, as Get deletes them); All does not extend an OnReadAndWrite
// expiry, which would write the whole state again. key is valid only
// during the call. fn may read and write state; the iteration goes on over
// the state as it was when All started. If fn returns an error, All stops
// and returns it.
func (v *ValueState[T]) All(s Scope, fn func(key []byte, val T) error) error {
	prefix := v.d.namePrefix()
	var fnErr error
	err := s.Store().Scan(prefix, func(k, raw []byte) error {
		pk, err := DecodeKey(k)
		if err != nil {
			return err
		}
		if len(pk.Sub) > 0 {
			return fmt.Errorf("%w: value state entry %q has a tail", ErrCorrupt, k)
		}
		payload, ok, err := v.d.unwrap(s, k, raw, false)
		if !ok || err != nil {
			return err
		}
		val, err := decode(&v.d, v.codec, payload)
		if err != nil {
			return err
		}
		if err := fn(pk.UserKey, val); err != nil {
			fnErr = err
			return ErrStopScan
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	return v.d.wrap("scan", err)
}

// Keys calls fn with each record key that holds state name in the scope's
// store (its task's, for a query's scope), once each, whatever the state's
// kind (value, list, map, reducing, aggregating, with or without a TTL),
// in the store's order: shorter keys first, then by bytes. With after set,
// it starts past that key, so a listing can go on where it stopped. An
// expired value's key may be listed (the value reads as absent). key is
// valid during the call only. fn's error stops the scan and is returned.
// It reads in the scope's store, as All does: a query's scope sees
// committed state only. (A state is of one kind; were a name's entries of
// both, keyed and keyed with a TTL, those of each would be listed in turn.)
func Keys(s Scope, name string, after []byte, fn func(key []byte) error) error {
	for _, kind := range [...]Kind{KindKeyed, KindKeyedTTL} {
		k := EncodeKey(kind, name, nil, nil)
		prefix := k[:len(k)-1] // without the empty record key's length
		start := prefix
		if after != nil {
			start = EncodeKey(kind, name, after, nil)
		}
		var last []byte
		seen := false
		var fnErr error
		err := s.Store().ScanFrom(prefix, start, func(k, _ []byte) error {
			pk, err := DecodeKey(k)
			if err != nil {
				return err
			}
			if seen && bytes.Equal(pk.UserKey, last) || after != nil && bytes.Equal(pk.UserKey, after) {
				return nil // the same key's next entry (a list's, a map's)
			}
			last, seen = append(last[:0], pk.UserKey...), true
			if err := fn(pk.UserKey); err != nil {
				fnErr = err
				return ErrStopScan
			}
			return nil
		})
		if fnErr != nil {
			return fnErr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
