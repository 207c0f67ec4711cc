package jobs

import "github.com/sluicehq/sluice"

// Echo copies every input record (key, value, headers) to the same
// partition number of the output topic, in order. It keeps no state: it
// exercises the transaction path alone.
func Echo() sluice.Job {
	return sluice.Job{
		Name:  "echo",
		Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.EmitToPartition(ctx.OutputTopic(), rec.Partition, rec.Key, rec.Value, rec.Headers...)
			return nil
		},
	}
}
