package kstate

import (
	"fmt"
	"time"
)

// Scope is what a processing context gives keyed state: the task's store,
// the key of the record being processed, and the processing-time clock.
// Keyed state reads and writes the entry of Scope.Key and nothing else.
type Scope interface {
	Store() *Store
	Key() []byte
	// Now is the processing time. Sluice's record context reads the
	// wall clock at the start of a batch and then every few records: it
	// is never ahead of the wall clock, and within a millisecond of it
	// while records are quick and nothing pauses (docs/time.md).
	Now() time.Time
}

// Option configures a state descriptor.
type Option func(*stateOptions)

type stateOptions struct {
	ttl ttlConfig
}

// descriptor is what every keyed state type shares: a name, which is its
// identity in the backend and the changelog, and the TTL policy.
//
// Names must be unique within a job: two descriptors with the same name read
// and write the same entries.
type descriptor struct {
	name string
	ttl  ttlConfig
	// kind is the physical key kind of the state's entries: KindKeyedTTL
	// when values carry the expiry header, so that the key alone says how
	// to read the value (see SweepExpired). Every key of the state, point
	// or prefix, is built with it.
	kind Kind
}

// newDescriptor validates a declaration. Declarations run once, at package
// or job set-up, so a bad one is a programmer error and panics, as
// regexp.MustCompile does.
func newDescriptor(typ, name string, opts []Option) descriptor {
	if name == "" {
		panic(fmt.Sprintf("kstate: %s state declared with an empty name", typ))
	}
	var o stateOptions
	for _, opt := range opts {
		opt(&o)
	}
	kind := KindKeyed
	if o.ttl.enabled() {
		kind = KindKeyedTTL
	}
	return descriptor{name: name, ttl: o.ttl, kind: kind}
}

func mustCodec[T any](typ, name, what string, c Codec[T]) {
	if c == nil {
		panic(fmt.Sprintf("kstate: %s state %q declared with a nil %s", typ, name, what))
	}
}

// key builds the entry's key in the store's reusable buffer (see
// Store.appendKey): valid for point operations until the next key call.
func (d *descriptor) key(s Scope, sub []byte) []byte {
	return s.Store().appendKey(d.kind, d.name, s.Key(), sub)
}

// prefix returns a fresh key prefix of all entries of this state for the
// current record key, for scans.
func (d *descriptor) prefix(s Scope) []byte {
	return EncodeKey(d.kind, d.name, s.Key(), nil)
}

// namePrefix returns a fresh prefix of every entry of this state, of every
// record key: the key up to the record key's length.
func (d *descriptor) namePrefix() []byte {
	k := EncodeKey(d.kind, d.name, nil, nil)
	return k[:len(k)-1] // without the empty record key's length
}

// load returns the payload stored under key (a key from d.key), applying
// the TTL policy.
func (d *descriptor) load(s Scope, key []byte) ([]byte, bool, error) {
	raw, ok, err := s.Store().Get(key)
	if err != nil {
		return nil, false, d.wrap("read", err)
	}
	if !ok {
		return nil, false, nil
	}
	return d.unwrapTTL(s, key, raw)
}

// save stores payload under key, adding the TTL header if configured. It
// returns the refusal of an invalid key at once (the Store also records it
// for RecordErr), so the caller's record fails where it happened.
func (d *descriptor) save(s Scope, key, payload []byte) error {
	if err := checkKey(key); err != nil {
		s.Store().fail(err)
		return d.wrap("write", err)
	}
	if d.ttl.enabled() {
		s.Store().putOwned(key, d.ttl.wrap(s.Now(), payload))
		return nil
	}
	s.Store().Put(key, payload)
	return nil
}

func (d *descriptor) remove(s Scope, key []byte) { s.Store().Delete(key) }

// saveValue encodes v with c and stores it under key (a key from d.key), as
// save does. An AppendCodec encodes straight into the Store's arena, so the
// write allocates nothing.
func saveValue[T any](s Scope, d *descriptor, c Codec[T], key []byte, v T) error {
	ac, ok := c.(AppendCodec[T])
	if !ok || d.ttl.enabled() {
		b, err := encode(d, c, v)
		if err != nil {
			return err
		}
		return d.save(s, key, b)
	}
	if err := checkKey(key); err != nil {
		s.Store().fail(err)
		return d.wrap("write", err)
	}
	st := s.Store()
	b, err := ac.AppendEncode(st.values.free(), v)
	if err != nil {
		return d.wrap("encode", err)
	}
	if err := st.checkEntry(key, b); err != nil {
		st.fail(err) // the record fails, as putOwned's refusal does
		return nil
	}
	// Over the key's value in place if it can (the arena's free space
	// then stays free), else kept from the arena.
	if !st.overwrite(key, b) {
		st.writeOwned(key, st.values.keep(b))
	}
	return nil
}

// clearAll deletes every entry under the state's prefix for the current key:
// the single entry of a value-like state or every entry of a map.
func (d *descriptor) clearAll(s Scope) error {
	st := s.Store()
	err := st.Scan(d.prefix(s), func(k, _ []byte) error {
		st.Delete(k)
		return nil
	})
	return d.wrap("clear", err)
}

// wrap names the state in an error, so a failure deep in a job says which
// state it came from.
func (d *descriptor) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("kstate: state %q: %s: %w", d.name, op, err)
}

// encode and decode run a codec and name the state in its errors.
func encode[T any](d *descriptor, c Codec[T], v T) ([]byte, error) {
	b, err := c.Encode(v)
	return b, d.wrap("encode", err)
}

func decode[T any](d *descriptor, c Codec[T], b []byte) (T, error) {
	v, err := c.Decode(b)
	return v, d.wrap("decode", err)
}
