package kstate

// MapState is a map per record key (Flink's MapState).
//
// Each map entry is its own store entry, keyed by the state's prefix for the
// record key followed by the encoded map key. Reading or writing one entry
// touches one key, and an epoch's changelog carries only the entries that
// changed, however large the map.
type MapState[K comparable, V any] struct {
	d        descriptor
	keyCodec Codec[K]
	valCodec Codec[V]
}

// Map declares a map state. It panics if name is empty or a codec is nil.
//
// Entries iterates in the byte order of the encoded keys, so choose the key
// codec with that in mind (String and Bytes sort lexically; Int64 sorts
// non-negative numbers numerically).
func Map[K comparable, V any](name string, kc Codec[K], vc Codec[V], opts ...Option) *MapState[K, V] {
	d := newDescriptor("map", name, opts)
	mustCodec("map", name, "key codec", kc)
	mustCodec("map", name, "value codec", vc)
	return &MapState[K, V]{d: d, keyCodec: kc, valCodec: vc}
}

// Name returns the state's name.
func (m *MapState[K, V]) Name() string { return m.d.name }

// Get returns the value of k in the current key's map.
func (m *MapState[K, V]) Get(s Scope, k K) (V, bool, error) {
	var zero V
	sub, err := encode(&m.d, m.keyCodec, k)
	if err != nil {
		return zero, false, err
	}
	raw, ok, err := m.d.load(s, m.d.key(s, sub))
	if !ok || err != nil {
		return zero, false, err
	}
	v, err := decode(&m.d, m.valCodec, raw)
	if err != nil {
		return zero, false, err
	}
	return v, true, nil
}

// Put sets k to v in the current key's map.
func (m *MapState[K, V]) Put(s Scope, k K, v V) error {
	sub, err := encode(&m.d, m.keyCodec, k)
	if err != nil {
		return err
	}
	return saveValue(s, &m.d, m.valCodec, m.d.key(s, sub), v)
}

// Remove deletes k from the current key's map.
func (m *MapState[K, V]) Remove(s Scope, k K) error {
	sub, err := encode(&m.d, m.keyCodec, k)
	if err != nil {
		return err
	}
	m.d.remove(s, m.d.key(s, sub))
	return nil
}

// Entries calls fn for every entry of the current key's map in ascending
// order of the encoded keys. fn may read and write state, including this
// map; the iteration goes on over the map as it was when Entries started.
// If fn returns an error, Entries stops and returns it.
func (m *MapState[K, V]) Entries(s Scope, fn func(K, V) error) error {
	prefix := m.d.prefix(s)
	var fnErr error
	err := s.Store().Scan(prefix, func(key, raw []byte) error {
		payload, ok, err := m.d.unwrapTTL(s, key, raw)
		if !ok || err != nil {
			return err
		}
		k, err := decode(&m.d, m.keyCodec, key[len(prefix):])
		if err != nil {
			return err
		}
		v, err := decode(&m.d, m.valCodec, payload)
		if err != nil {
			return err
		}
		if err := fn(k, v); err != nil {
			// Keep fn's error as it is: it is the caller's, not the map's.
			fnErr = err
			return ErrStopScan
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	return m.d.wrap("scan", err)
}

// Clear deletes every entry of the current key's map.
func (m *MapState[K, V]) Clear(s Scope) error { return m.d.clearAll(s) }
