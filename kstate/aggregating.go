package kstate

import "fmt"

// AggregateFunc is an aggregation with an accumulator (Flink's
// AggregateFunction without merge). The accumulator is what is stored, so it
// needs a codec; the result is computed on every read.
type AggregateFunc[IN, ACC, OUT any] interface {
	CreateAccumulator() ACC
	Add(in IN, acc ACC) ACC
	Result(acc ACC) OUT
}

// AggregatingState aggregates every added input into an accumulator
// (Flink's AggregatingState).
type AggregatingState[IN, ACC, OUT any] struct {
	d     descriptor
	codec Codec[ACC]
	agg   AggregateFunc[IN, ACC, OUT]
}

// Aggregating declares an aggregating state. It panics if name is empty or
// accCodec or agg is nil.
func Aggregating[IN, ACC, OUT any](name string, accCodec Codec[ACC], agg AggregateFunc[IN, ACC, OUT], opts ...Option) *AggregatingState[IN, ACC, OUT] {
	d := newDescriptor("aggregating", name, opts)
	mustCodec("aggregating", name, "accumulator codec", accCodec)
	if agg == nil {
		panic(fmt.Sprintf("kstate: aggregating state %q declared with a nil AggregateFunc", name))
	}
	return &AggregatingState[IN, ACC, OUT]{d: d, codec: accCodec, agg: agg}
}

// Name returns the state's name.
func (a *AggregatingState[IN, ACC, OUT]) Name() string { return a.d.name }

// Add adds in to the current key's accumulator, creating it if needed.
func (a *AggregatingState[IN, ACC, OUT]) Add(s Scope, in IN) error {
	acc, ok, err := a.accumulator(s)
	if err != nil {
		return err
	}
	if !ok {
		acc = a.agg.CreateAccumulator()
	}
	return saveValue(s, &a.d, a.codec, a.d.key(s, nil), a.agg.Add(in, acc))
}

// Get returns the result for the current key, or false if nothing was added.
func (a *AggregatingState[IN, ACC, OUT]) Get(s Scope) (OUT, bool, error) {
	var zero OUT
	acc, ok, err := a.accumulator(s)
	if !ok || err != nil {
		return zero, false, err
	}
	return a.agg.Result(acc), true, nil
}

// Clear deletes the current key's accumulator.
func (a *AggregatingState[IN, ACC, OUT]) Clear(s Scope) error {
	a.d.remove(s, a.d.key(s, nil))
	return nil
}

func (a *AggregatingState[IN, ACC, OUT]) accumulator(s Scope) (ACC, bool, error) {
	var zero ACC
	raw, ok, err := a.d.load(s, a.d.key(s, nil))
	if !ok || err != nil {
		return zero, false, err
	}
	acc, err := decode(&a.d, a.codec, raw)
	if err != nil {
		return zero, false, err
	}
	return acc, true, nil
}
