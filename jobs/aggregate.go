package jobs

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Aggregation is the aggregate job's state and output per key.
type Aggregation struct {
	Count int64 `json:"count"`
	Sum   int64 `json:"sum"`
	Min   int64 `json:"min"`
	Max   int64 `json:"max"`
}

// aggregation is stored in 32 fixed bytes: JSON costs more than the rest of
// the record's processing put together.
var aggregation = kstate.Value[Aggregation]("aggregate", aggregationCodec{})

type aggregationCodec struct{}

func (c aggregationCodec) Encode(a Aggregation) ([]byte, error) {
	return c.AppendEncode(make([]byte, 0, 32), a)
}

// AppendEncode makes it a kstate.AppendCodec: the store encodes in place.
func (aggregationCodec) AppendEncode(b []byte, a Aggregation) ([]byte, error) {
	for _, v := range [4]int64{a.Count, a.Sum, a.Min, a.Max} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b, nil
}

func (aggregationCodec) Decode(b []byte) (Aggregation, error) {
	if len(b) != 32 {
		return Aggregation{}, fmt.Errorf("aggregation: %d bytes, want 32", len(b))
	}
	v := func(i int) int64 { return int64(binary.BigEndian.Uint64(b[8*i:])) }
	return Aggregation{Count: v(0), Sum: v(1), Min: v(2), Max: v(3)}, nil
}

// appendJSON writes {"count":C,"sum":S,"min":m,"max":M}, the job's output
// contract, without reflection.
func (a Aggregation) appendJSON(b []byte) []byte {
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, a.Count, 10)
	b = append(b, `,"sum":`...)
	b = strconv.AppendInt(b, a.Sum, 10)
	b = append(b, `,"min":`...)
	b = strconv.AppendInt(b, a.Min, 10)
	b = append(b, `,"max":`...)
	b = strconv.AppendInt(b, a.Max, 10)
	return append(b, '}')
}

// outputChunk is where aggregate outputs are carved from: one allocation
// for many outputs instead of one each (an output is kept by its Kafka
// record until the produce is acknowledged, so a chunk is never reused;
// the collector frees it once none of its outputs is in flight).
type outputChunk struct{ b []byte }

// outputChunks holds a current chunk per P: a Get and a Put on the same
// goroutine take the P's own slot, cheaper than an allocation.
var outputChunks = sync.Pool{New: func() any { return new(outputChunk) }}

const (
	outputChunkSize = 32 << 10
	maxOutputLen    = 4*20 + len(`{"count":,"sum":,"min":,"max":}`) // four int64s in base 10
)

// output returns a's output, {"count":C,"sum":S,"min":m,"max":M},
// carved from a chunk.
func (a Aggregation) output() []byte {
	c := outputChunks.Get().(*outputChunk)
	if cap(c.b)-len(c.b) < maxOutputLen {
		c.b = make([]byte, 0, outputChunkSize)
	}
	n := len(c.b)
	out := a.appendJSON(c.b[n : n : n+maxOutputLen])
	if len(out) <= maxOutputLen { // else append moved it out of the chunk
		c.b = c.b[:n+len(out)]
	}
	outputChunks.Put(c)
	return out[:len(out):len(out)]
}

// Aggregate keeps count, sum, min and max of base-10 int64 values per key
// and emits the running aggregation for every valid input, keyed like the
// input. A value that does not parse goes to the dead-letter topic without
// touching state.
func Aggregate() sluice.Job { return AggregateWith(AggregateOptions{Emit: true}) }

// AggregateOptions says where the aggregate job's results go.
type AggregateOptions struct {
	// Emit sends every valid input's running aggregation to the output
	// topic (Aggregate's behaviour).
	Emit bool
	// Rows writes it to the instance's sink as well (sluice.WriteRow), as
	// the row (key string, count, sum, min, max int64): with an upserting
	// sink keyed by the key, the table holds each key's aggregation as of
	// the last committed epoch (AggregateColumns).
	Rows bool
}

// AggregateColumns are the columns of the aggregate job's rows, the
// first one the key.
var AggregateColumns = []string{"key", "count", "sum", "min", "max"}

// AggregateWith is Aggregate with its results going where o says.
func AggregateWith(o AggregateOptions) sluice.Job {
	return sluice.Job{
		Name:   "aggregate",
		States: []string{aggregation.Name()},
		QueryState: func(s kstate.Scope, _ string) (any, bool, error) {
			a, ok, err := aggregation.Get(s)
			return a, ok, err
		},
		Emits: o.Emit,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			v, err := parseInt(rec.Value)
			if err != nil {
				return &sluice.DecodeError{Err: err}
			}
			a, ok, err := aggregation.Get(ctx)
			if err != nil {
				return err
			}
			if !ok {
				a = Aggregation{Min: v, Max: v}
			}
			a.Count++
			a.Sum += v
			a.Min = min(a.Min, v)
			a.Max = max(a.Max, v)
			if err := aggregation.Set(ctx, a); err != nil {
				return err
			}
			if o.Rows {
				if err := sluice.WriteRow(ctx, string(rec.Key), a.Count, a.Sum, a.Min, a.Max); err != nil {
					return err
				}
			}
			if o.Emit {
				ctx.Emit(rec.Key, a.output())
			}
			return nil
		},
	}
}
