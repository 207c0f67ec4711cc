package jobs

import (
	"encoding/json"
	"strconv"

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

var aggregation = kstate.Value[Aggregation]("aggregate", kstate.JSON[Aggregation]())

// Aggregate keeps count, sum, min and max of base-10 int64 values per key
// and emits the running aggregation for every valid input, keyed like the
// input. A value that does not parse goes to the dead-letter topic without
// touching state.
func Aggregate() sluice.Job {
	return sluice.Job{
		Name:  "aggregate",
		Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			v, err := strconv.ParseInt(string(rec.Value), 10, 64)
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
			out, err := json.Marshal(a)
			if err != nil {
				return err
			}
			ctx.Emit(rec.Key, out)
			return nil
		},
	}
}
