package pgsink_test

import (
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink/pgsink"
)

// A job that keeps a running total per customer in a table, exactly once:
// the sink upserts one row per customer per epoch, committed with the
// epoch's Kafka transaction. (Not run: it needs a PostgreSQL server with
// max_prepared_transactions above 0.)
func Example() {
	sink, err := pgsink.New(pgsink.Config{
		URL:     "postgres://sluice:secret@db:5432/shop",
		App:     "totals",
		Table:   "customer_totals",
		Columns: pgsink.Named([]string{"customer", "total"}, pgsink.Text, pgsink.BigInt),
		Key:     []string{"customer"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close()
	total := kstate.Value[int64]("total", kstate.Int64())
	opts := sluice.Options{
		Brokers: []string{"kafka:9092"}, AppID: "totals", InstanceID: "totals-1",
		InputTopics: []string{"orders"},
		Sink:        sink,
		Job: sluice.Job{Name: "totals", Process: func(ctx sluice.Context, rec *sluice.Record) error {
			amount, err := strconv.ParseInt(string(rec.Value), 10, 64)
			if err != nil {
				return &sluice.DecodeError{Err: err}
			}
			sum, _, err := total.Get(ctx)
			if err != nil {
				return err
			}
			sum += amount
			if err := total.Set(ctx, sum); err != nil {
				return err
			}
			return sluice.WriteRow(ctx, string(rec.Key), sum)
		}},
	}
	inst, err := sluice.New(opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = inst // inst.Run(ctx) runs it until ctx ends
}
