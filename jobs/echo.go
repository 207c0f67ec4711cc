package jobs

import "github.com/sluicehq/sluice"

// Echo copies every input record (key, value, headers) to the same
// partition number of the output topic, in order. It keeps no state: it
// exercises the transaction path alone.
func Echo() sluice.Job { return EchoWith(EchoOptions{Emit: true}) }

// EchoOptions says where the echo job's copies go.
type EchoOptions struct {
	// Emit copies every record to the output topic (Echo's behaviour).
	Emit bool
	// Rows writes it to the instance's sink as well (sluice.WriteRow), as
	// the row (topic string, partition int32, offset int64, key, value
	// []byte; a null key stays nil): with an inserting sink, one row per
	// input record (EchoColumns).
	Rows bool
}

// EchoColumns are the columns of the echo job's rows.
var EchoColumns = []string{"topic", "partition", "offset", "key", "value"}

// EchoWith is Echo with its copies going where o says.
func EchoWith(o EchoOptions) sluice.Job {
	return sluice.Job{
		Name:  "echo",
		Emits: o.Emit,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			if o.Rows {
				if err := sluice.WriteRow(ctx, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value); err != nil {
					return err
				}
			}
			if o.Emit {
				ctx.EmitToPartition(ctx.OutputTopic(), rec.Partition, rec.Key, rec.Value, rec.Headers...)
			}
			return nil
		},
	}
}
