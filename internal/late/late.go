// Package late handles a record too late for an event-time operator, the
// same way in package window and package join: it goes to a side output,
// unchanged but for one more header naming its topic, or is dropped and
// counted, per key in keyed state and in a Prometheus counter.
package late

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Handle sends rec to the side output out, with sluice.HeaderTopic naming
// the topic it came from (which tells the sides of a join apart), or, with
// out unset, adds one to the key's dropped count and to counter (if set;
// committed or not, so a replayed epoch counts again).
func Handle(ctx sluice.Context, rec *sluice.Record, out sluice.OutputTag, dropped *kstate.ValueState[int64], counter prometheus.Counter) error {
	if out != "" {
		hs := append(slices.Clip(rec.Headers), sluice.Header{Key: sluice.HeaderTopic, Value: []byte(rec.Topic)})
		ctx.Output(out, rec.Key, rec.Value, hs...)
		return nil
	}
	n, _, err := dropped.Get(ctx)
	if err != nil {
		return err
	}
	if counter != nil {
		counter.Inc()
	}
	return dropped.Set(ctx, n+1)
}
