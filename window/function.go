package window

import (
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Function is what a window computes when it fires. Build one with Reduce,
// ReduceWith, Aggregate, AggregateWith (incremental: one accumulator per
// window, updated as records come) or Process (full-window: every record
// of the window is kept and handed over when it fires). The zero Function
// is invalid.
type Function[IN, OUT any] struct {
	// Incremental functions: the encoded accumulator is what a window
	// stores.
	first func(in IN) ([]byte, error)
	add   func(acc []byte, in IN) ([]byte, error)
	merge func(a, b []byte) ([]byte, error) // nil: cannot merge sessions
	fire  func(ctx sluice.Context, w Window, acc []byte, emit func(OUT)) error

	// Full-window functions: the elements are stored one state entry each.
	elements kstate.Codec[IN]
	process  ProcessFunc[IN, OUT]

	what string // for errors: the constructor's name
}

// ProcessFunc is a full-window function (Flink's ProcessWindowFunction):
// it gets every element of the window, in the order they were added (the
// elements of sessions that merged come session by session), and emits
// any number of results. ctx is scoped to the window's key: keyed state,
// side outputs and the watermark work as in a timer handler. An error
// fails the firing (see Spec).
type ProcessFunc[IN, OUT any] func(ctx sluice.Context, w Window, elements []IN, emit func(OUT)) error

// WindowFunc gets an incremental aggregate's result for the window when it
// fires and emits any number of results (Flink's aggregate or reduce with a
// ProcessWindowFunction).
type WindowFunc[R, OUT any] func(ctx sluice.Context, w Window, result R, emit func(OUT)) error

// Merger is what an AggregateFunc needs besides kstate.AggregateFunc to be
// used with session windows: merging the accumulators of two sessions that
// a record bridges (Flink's AggregateFunction.merge).
type Merger[ACC any] interface {
	Merge(a, b ACC) ACC
}

// Reduce folds the window's elements with reduce and emits the result:
// the window stores one T, encoded with c. reduce must be deterministic
// (replays re-run it) and, for sessions, associative (merging applies it
// to two partial results).
func Reduce[T any](c kstate.Codec[T], reduce func(a, b T) T) Function[T, T] {
	return ReduceWith(c, reduce, func(_ sluice.Context, _ Window, r T, emit func(T)) error {
		emit(r)
		return nil
	})
}

// ReduceWith is Reduce whose result goes through fn, which also gets the
// window.
func ReduceWith[T, OUT any](c kstate.Codec[T], reduce func(a, b T) T, fn WindowFunc[T, OUT]) Function[T, OUT] {
	if c == nil || reduce == nil || fn == nil {
		return Function[T, OUT]{what: "ReduceWith: nil codec, reduce or window function"}
	}
	return incremental(c,
		func(in T) T { return in },
		func(in T, acc T) T { return reduce(acc, in) },
		reduce,
		func(acc T) T { return acc },
		fn, "Reduce")
}

// Aggregate aggregates the window's elements into an accumulator with agg
// and emits agg's result: the window stores one ACC, encoded with c. For
// session windows agg must also implement Merger[ACC].
func Aggregate[IN, ACC, OUT any](agg kstate.AggregateFunc[IN, ACC, OUT], c kstate.Codec[ACC]) Function[IN, OUT] {
	return AggregateWith(agg, c, func(_ sluice.Context, _ Window, r OUT, emit func(OUT)) error {
		emit(r)
		return nil
	})
}

// AggregateWith is Aggregate whose result goes through fn, which also gets
// the window.
func AggregateWith[IN, ACC, R, OUT any](agg kstate.AggregateFunc[IN, ACC, R], c kstate.Codec[ACC], fn WindowFunc[R, OUT]) Function[IN, OUT] {
	if agg == nil || c == nil || fn == nil {
		return Function[IN, OUT]{what: "AggregateWith: nil aggregate, codec or window function"}
	}
	var merge func(a, b ACC) ACC
	if m, ok := agg.(Merger[ACC]); ok {
		merge = m.Merge
	}
	return incremental(c,
		func(in IN) ACC { return agg.Add(in, agg.CreateAccumulator()) },
		agg.Add,
		merge,
		agg.Result,
		fn, "Aggregate")
}

// Process keeps every element of the window, each encoded with c in a
// state entry of its own, and hands them to fn when the window fires.
func Process[IN, OUT any](c kstate.Codec[IN], fn ProcessFunc[IN, OUT]) Function[IN, OUT] {
	if c == nil || fn == nil {
		return Function[IN, OUT]{what: "Process: nil codec or function"}
	}
	return Function[IN, OUT]{elements: c, process: fn, what: "Process"}
}

// incremental builds an incremental Function from typed parts; the window
// operator sees only encoded accumulators.
func incremental[IN, ACC, R, OUT any](c kstate.Codec[ACC], first func(IN) ACC, add func(IN, ACC) ACC, merge func(a, b ACC) ACC, result func(ACC) R, fn WindowFunc[R, OUT], what string) Function[IN, OUT] {
	decode := func(b []byte) (ACC, error) {
		acc, err := c.Decode(b)
		if err != nil {
			return acc, fmt.Errorf("window: decode accumulator: %w", err)
		}
		return acc, nil
	}
	encode := func(acc ACC) ([]byte, error) {
		b, err := c.Encode(acc)
		if err != nil {
			return nil, fmt.Errorf("window: encode accumulator: %w", err)
		}
		return b, nil
	}
	f := Function[IN, OUT]{
		first: func(in IN) ([]byte, error) { return encode(first(in)) },
		add: func(b []byte, in IN) ([]byte, error) {
			acc, err := decode(b)
			if err != nil {
				return nil, err
			}
			return encode(add(in, acc))
		},
		fire: func(ctx sluice.Context, w Window, b []byte, emit func(OUT)) error {
			acc, err := decode(b)
			if err != nil {
				return err
			}
			return fn(ctx, w, result(acc), emit)
		},
		what: what,
	}
	if merge != nil {
		f.merge = func(a, b []byte) ([]byte, error) {
			x, err := decode(a)
			if err != nil {
				return nil, err
			}
			y, err := decode(b)
			if err != nil {
				return nil, err
			}
			return encode(merge(x, y))
		}
	}
	return f
}

func (f Function[IN, OUT]) incremental() bool { return f.fire != nil }

func (f Function[IN, OUT]) validate(merging bool) error {
	switch {
	case f.fire == nil && f.process == nil:
		if f.what != "" {
			return fmt.Errorf("Function: %s", f.what)
		}
		return fmt.Errorf("no Function (use Reduce, Aggregate, AggregateWith or Process)")
	case merging && f.incremental() && f.merge == nil:
		return fmt.Errorf("session windows merge accumulators: the AggregateFunc must implement window.Merger")
	}
	return nil
}
