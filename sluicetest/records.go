package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
)

// Output returns the records committed to the job's output topic so far.
// See Records.
func (h *Harness) Output() []sluice.Record {
	h.t.Helper()
	return h.Records(OutputTopic)
}

// SideOutput returns the records committed to the side output tag so far,
// whose topic the harness names after the tag. See Records.
func (h *Harness) SideOutput(tag sluice.OutputTag) []sluice.Record {
	h.t.Helper()
	if !slices.Contains(h.job.SideOutputs, tag) {
		h.t.Fatalf("sluicetest: job %s declares no side output %q", h.job.Name, tag)
	}
	return h.Records(string(tag))
}

// DeadLetters returns the records committed to the dead-letter topic so
// far: the records and timers the job failed on, with headers saying why
// (sluice.stage, sluice.error, …). See Records.
func (h *Harness) DeadLetters() []sluice.Record {
	h.t.Helper()
	return h.Records(DeadLetterTopic)
}

// Records returns every committed record of topic, read from the start as
// a read_committed consumer reads it: records of aborted transactions
// never show, nor those of a transaction still open. They come in
// partition order, then offset order, and include what a killed instance
// committed before it died; a fresh reader reads them at each call. Call
// Settle first to read what the records sent so far caused.
func (h *Harness) Records(topic string) []sluice.Record {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	recs, err := h.read(ctx, topic)
	if err != nil {
		h.t.Fatalf("sluicetest: read %s: %v", topic, err)
	}
	return recs
}

// read consumes every partition of topic up to its last stable offset, the
// end of what is committed. Control records (transaction markers) are kept
// so that the reader's position is known even when a partition ends with
// one; they are not returned.
func (h *Harness) read(ctx context.Context, topic string) ([]sluice.Record, error) {
	ends, err := h.adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets: %w (Options.Topics creates more topics)", err)
	}
	want := map[int32]int64{} // partitions not read to their end yet
	end := map[int32]int64{}
	start := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			end[o.Partition] = o.Offset
			start[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(want) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(h.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	byPartition := map[int32][]sluice.Record{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w: partitions %v not read to their end", err, want)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err)) })
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= end[r.Partition] {
				delete(want, r.Partition)
			}
			if r.Attrs.IsControl() || r.Offset >= end[r.Partition] {
				return // a marker, or committed after the ends were listed
			}
			byPartition[r.Partition] = append(byPartition[r.Partition], record(r))
		})
	}
	var out []sluice.Record
	for _, p := range slices.Sorted(maps.Keys(byPartition)) {
		out = append(out, byPartition[p]...)
	}
	return out, nil
}

func record(r *kgo.Record) sluice.Record {
	out := sluice.Record{
		Key:       r.Key,
		Value:     r.Value,
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Timestamp: r.Timestamp,
	}
	for _, hd := range r.Headers {
		out.Headers = append(out.Headers, sluice.Header{Key: hd.Key, Value: hd.Value})
	}
	return out
}
