package sluice_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Two input topics written in record batches of some 300 KB, over the
// input consumer's bound of 64 KiB a partition, with their records'
// timestamps interleaved: the task still processes them in timestamp order.
// A batch over the bound is returned only as the first of a fetch response
// (KIP-74), so each response held one topic: the merge held the other
// topic's records back for it and fetched them again, each batch some 90
// times, until it went on without the missing topic after maxTaskIdle and
// out of order. The bound now rises to the batches read.
func TestLargeBatchesOfTwoTopicsMergeInOrder(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a", "b", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	// Flushed by hand, every 300 records of a topic make one batch.
	p, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ManualFlushing(),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const batches, perBatch = 4, 300
	base := time.UnixMilli(1_700_000_000_000)
	for k := range batches {
		for i := range perBatch {
			n := k*perBatch + i
			for j, topic := range []string{"a", "b"} {
				v := make([]byte, 1000) // random: the batch stays 300 KB compressed
				if _, err := rand.Read(v); err != nil {
					t.Fatal(err)
				}
				p.Produce(ctx, &kgo.Record{Topic: topic, Value: v, Timestamp: base.Add(time.Duration(2*n+j) * time.Millisecond)}, nil)
			}
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const total = 2 * batches * perBatch

	// Each output is its input's timestamp; "out" has one partition, so
	// its committed records are in the order the task processed them.
	job := sluice.Job{Name: "stamps", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		ctx.Emit(nil, binary.BigEndian.AppendUint64(nil, uint64(rec.Timestamp.UnixMilli())))
		return nil
	}}
	o := testOptions(c.ListenAddrs(), "merge", job, t.TempDir())
	o.InputTopics, o.OutputTopic, o.Backend = []string{"a", "b"}, "out", kstate.MemoryBackend
	runUntil(t, o, consumedAll(kadm.NewClient(p), "merge", total))

	reader, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("out"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last int64
	for read := 0; read < total; {
		fs := reader.PollFetches(rctx)
		if rctx.Err() != nil {
			t.Fatalf("read %d of %d outputs within a minute", read, total)
		}
		for _, r := range fs.Records() {
			ts := int64(binary.BigEndian.Uint64(r.Value))
			if ts < last {
				t.Fatalf("output %d: input of %s processed after one of %s", read, time.UnixMilli(ts).Sub(base), time.UnixMilli(last).Sub(base))
			}
			last = ts
			read++
		}
	}
}
