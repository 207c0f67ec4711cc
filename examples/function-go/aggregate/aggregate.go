// Package aggregate is the aggregate job as a sidecar function (the Go SDK's
// example): count, sum, min and max of base-10 int64 values per key, and
// for every record the running aggregation {"count":C,"sum":S,"min":m,"max":M}
// keyed like the input (DESIGN §7). A value that does not parse goes to the
// dead-letter topic on its own (Result.Fail); the key's other records
// count.
package aggregate

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/function/sdk"
)

// Declaration is the function's one state.
var Declaration = sdk.Declaration{States: []sdk.State{{Name: "aggregate"}}}

type aggregation struct {
	Count int64 `json:"count"`
	Sum   int64 `json:"sum"`
	Min   int64 `json:"min"`
	Max   int64 `json:"max"`
}

// Func is the function.
func Func(_ context.Context, c *sdk.Call) *sdk.Result {
	r := &sdk.Result{}
	var a *aggregation
	if b, ok := c.States["aggregate"]; ok {
		a = &aggregation{}
		if err := json.Unmarshal(b, a); err != nil {
			return r.DeadLetter(fmt.Sprintf("state: %v", err))
		}
	}
	var last []byte // the state is the last output: one encoding per event
	for i, e := range c.Events {
		if e.Record == nil {
			continue // no timers are set
		}
		v, err := strconv.ParseInt(string(e.Record.GetValue()), 10, 64)
		if err != nil {
			r.Fail(i, err.Error())
			continue
		}
		if a == nil {
			a = &aggregation{Min: v, Max: v}
		}
		a.Count++
		a.Sum += v
		a.Min = min(a.Min, v)
		a.Max = max(a.Max, v)
		last, _ = json.Marshal(a)
		r.Emit(e.Record.GetKey(), last)
	}
	if last != nil {
		r.Set("aggregate", last)
	}
	return r
}
