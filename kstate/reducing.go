package kstate

import "fmt"

// ReducingState folds every added value into one (Flink's ReducingState).
type ReducingState[T any] struct {
	d      descriptor
	codec  Codec[T]
	reduce func(a, b T) T
}

// Reducing declares a reducing state: Add(v) stores reduce(current, v), or v
// when there is no current value. reduce must be deterministic, since
// restores never re-run it. Reducing panics if name is empty or c or reduce
// is nil.
func Reducing[T any](name string, c Codec[T], reduce func(a, b T) T, opts ...Option) *ReducingState[T] {
	d := newDescriptor("reducing", name, opts)
	mustCodec("reducing", name, "codec", c)
	if reduce == nil {
		panic(fmt.Sprintf("kstate: reducing state %q declared with a nil reduce function", name))
	}
	return &ReducingState[T]{d: d, codec: c, reduce: reduce}
}

// Name returns the state's name.
func (r *ReducingState[T]) Name() string { return r.d.name }

// Add folds v into the current key's value.
func (r *ReducingState[T]) Add(s Scope, v T) error {
	cur, ok, err := r.Get(s)
	if err != nil {
		return err
	}
	if ok {
		v = r.reduce(cur, v)
	}
	return saveValue(s, &r.d, r.codec, r.d.key(s, nil), v)
}

// Get returns the current key's reduced value, or false if nothing was added.
func (r *ReducingState[T]) Get(s Scope) (T, bool, error) {
	var zero T
	raw, ok, err := r.d.load(s, r.d.key(s, nil))
	if !ok || err != nil {
		return zero, false, err
	}
	v, err := decode(&r.d, r.codec, raw)
	if err != nil {
		return zero, false, err
	}
	return v, true, nil
}

// Clear deletes the current key's value.
func (r *ReducingState[T]) Clear(s Scope) error {
	r.d.remove(s, r.d.key(s, nil))
	return nil
}
