package kstate

import (
	"bytes"
	"encoding/binary"
	"errors"
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
// in the store's order (shorter keys first below 128 bytes; then by
// bytes). With after set, it starts past that key, so a listing can go on
// where it stopped. An expired value's key may be listed (the value reads
// as absent), and so may a key whose entries are of the state's other
// kind, left when a TTL was added or removed (they read as absent too):
// the two kinds' keys are merged in order. key is valid during the call
// only. fn's error stops the scan and is returned. It reads in the
// scope's store, as All does: a query's scope sees committed state only.
func Keys(s Scope, name string, after []byte, fn func(key []byte) error) error {
	kinds := [2]*keyRun{newKeyRun(s, KindKeyed, name, after), newKeyRun(s, KindKeyedTTL, name, after)}
	for {
		for _, r := range kinds {
			if err := r.fill(); err != nil {
				return err
			}
		}
		a, b := kinds[0].head(), kinds[1].head()
		var next []byte
		switch {
		case a == nil && b == nil:
			return nil
		case b == nil || a != nil && bytes.Compare(a, b) <= 0:
			next = a
		default:
			next = b
		}
		for _, r := range kinds {
			if h := r.head(); h != nil && bytes.Equal(h, next) {
				r.pop() // a key of both kinds is listed once
			}
		}
		if err := fn(next[uvarintLen(uint64(len(next))):]); err != nil {
			return err
		}
	}
}

// keyRun reads one kind's record keys of a state in store order, a batch
// at a time, each key as its length (uvarint) and bytes: the order the
// store sorts them in, so two kinds' keys merge by bytes.Compare.
type keyRun struct {
	s      Scope
	prefix []byte // [format][kind][name]
	next   []byte // where the next batch starts (a physical key)
	skip   []byte // the encoded key to leave out (after, or the last read)
	keys   [][]byte
	done   bool
}

// keyBatch is how many keys a run reads at a time.
const keyBatch = 256

func newKeyRun(s Scope, kind Kind, name string, after []byte) *keyRun {
	k := EncodeKey(kind, name, nil, nil)
	r := &keyRun{s: s, prefix: k[:len(k)-1]}
	r.next = r.prefix
	if after != nil {
		r.next = EncodeKey(kind, name, after, nil)
		r.skip = r.next[len(r.prefix):]
	}
	return r
}

func (r *keyRun) head() []byte {
	if len(r.keys) == 0 {
		return nil
	}
	return r.keys[0]
}

func (r *keyRun) pop() { r.keys = r.keys[1:] }

// fill reads the next batch once the last is used up.
func (r *keyRun) fill() error {
	if len(r.keys) > 0 || r.done {
		return nil
	}
	errFull := errors.New("batch full")
	err := r.s.Store().ScanFrom(r.prefix, r.next, func(k, _ []byte) error {
		enc := k[len(r.prefix):] // [uvarint len][key][sub]
		n, w := binary.Uvarint(enc)
		if w <= 0 || uint64(len(enc)-w) < n {
			return fmt.Errorf("%w: state key %q", ErrCorrupt, k)
		}
		enc = enc[:w+int(n)]
		if bytes.Equal(enc, r.skip) {
			return nil // the same key's next entry (a list's, a map's), or after
		}
		if len(r.keys) == keyBatch {
			r.next = bytes.Clone(k)
			return errFull
		}
		r.skip = bytes.Clone(enc)
		r.keys = append(r.keys, r.skip)
		return nil
	})
	switch {
	case errors.Is(err, errFull):
		return nil
	case err != nil:
		return err
	}
	r.done = true
	return nil
}
