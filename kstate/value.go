package kstate

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
