package sluice_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Two input topics written in record batches of some 300 KB, over the
// input consumer's bound of 64 KiB a partition, with their records'
// timestamps interleaved: the task still processes them in timestamp order.
// A batch over the bound is returned only as the first of a fetch response
// (KIP-74), so each response held one topic: the merge held the other
// topic's records back for it and fetched them again, each batch some 90
// times, until it went on without the missing topic after MaxTaskIdle and
// out of order. The bound now rises to the batches read. The test sets
// MaxTaskIdle to a minute: with the default second, a machine too busy to
// poll again within it would take the topics out of order by design.
// Without the raised bound, the task then stalls and the test fails at its
// minute.
func TestLargeBatchesOfTwoTopicsMergeInOrder(t *testing.T) {
	c, p := batchCluster(t, 1, []string{"a", "b", "out"})
	ctx := context.Background()
	const batches, perBatch = 4, 300
	base := time.UnixMilli(1_700_000_000_000)
	for k := range batches {
		for i := range perBatch {
			n := k*perBatch + i
			for j, topic := range []string{"a", "b"} {
				p.Produce(ctx, &kgo.Record{Topic: topic, Value: randomValue(t), Timestamp: base.Add(time.Duration(2*n+j) * time.Millisecond)}, nil)
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
	o.MaxTaskIdle = time.Minute
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

// Tasks in parallel over an input written in record batches of some
// 300 KB: polls hold several tasks' records (sluice_poll_partitions). With
// the fixed bound of 128 KiB a partition each fetch response held one
// batch, so each poll one task, and the second worker had nothing to do;
// with the bound raised but fetch sessions on, the broker kept the old
// bound for the partitions a response had skipped, and the same held
// (found by review). The records become readable once a fetch named every
// partition, so that all are in the consumer's fetch session, if it keeps
// one, before the first large batch is read.
func TestLargeBatchesGiveParallelTasksSeveralPartitions(t *testing.T) {
	c, p := batchCluster(t, 4, []string{"in"}, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID("loader"))
	ctx := context.Background()
	const batches, perBatch = 8, 300
	// In one transaction, so that every partition's batches become
	// readable at once (the instance reads read_committed): the first
	// response then holds one of them, and the others must learn the
	// raised bound while their positions have not moved.
	produce := func() {
		if err := p.BeginTransaction(); err != nil {
			t.Error(err)
			return
		}
		for range batches {
			for part := range int32(4) {
				for range perBatch {
					p.Produce(ctx, &kgo.Record{Topic: "in", Partition: part, Value: randomValue(t)}, nil)
				}
			}
			if err := p.Flush(ctx); err != nil {
				t.Error(err)
				return
			}
		}
		if err := p.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Error(err)
		}
	}
	adm := kadm.NewClient(p)
	topics, err := adm.ListTopics(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	in := topics["in"].ID
	// Set once fetch requests have named all four partitions: they are
	// then in the consumer's fetch session, if it keeps one. (Control
	// functions run one at a time.)
	var fetchedAll atomic.Bool
	named := map[int32]bool{}
	c.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range kr.(*kmsg.FetchRequest).Topics {
			if rt.Topic == "in" || rt.TopicID == in {
				for _, rp := range rt.Partitions {
					named[rp.Partition] = true
				}
			}
		}
		fetchedAll.Store(len(named) == 4)
		return nil, nil, false
	})
	job := sluice.Job{Name: "noop", Process: func(sluice.Context, *sluice.Record) error { return nil }}
	o := testOptions(c.ListenAddrs(), "par", job, t.TempDir())
	o.Backend, o.Parallelism = kstate.MemoryBackend, 2
	// Each partition ends with the transaction's commit marker, which
	// the committed offset may or may not be past.
	done := func(*sluice.Instance) bool {
		offs, err := adm.FetchOffsets(ctx, "par")
		sum := int64(0)
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		return err == nil && sum >= 4*batches*perBatch
	}
	produced := false
	runUntil(t, o, func(inst *sluice.Instance) bool {
		if !produced {
			if !inst.Ready() || !fetchedAll.Load() {
				return false
			}
			produce()
			produced = true
		}
		return done(inst)
	})

	polls, single := pollPartitions(t, o.Registry.(*prometheus.Registry))
	if polls == single {
		t.Fatalf("all %d polls held one partition's records", polls)
	}
}

// pollPartitions reads the sluice_poll_partitions histogram of reg: how
// many polls it observed, and how many of them held one partition.
func pollPartitions(t *testing.T, reg *prometheus.Registry) (polls, single uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_poll_partitions" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 1 {
				return h.GetSampleCount(), b.GetCumulativeCount()
			}
		}
	}
	t.Fatal("no sluice_poll_partitions histogram with a bucket at 1")
	return 0, 0
}

// batchCluster starts a one-broker cluster with topics of partitions each,
// and a producer to it flushed by hand (with extra options): the records
// of a partition between two flushes make one batch, up to 1 MiB.
func batchCluster(t *testing.T, partitions int32, topics []string, extra ...kgo.Opt) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ManualFlushing(),
		kgo.ProducerBatchMaxBytes(1 << 20), kgo.MaxBufferedRecords(1 << 20)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return c, p
}

// randomValue is 1,000 random bytes: a batch of them stays as large
// compressed.
func randomValue(t *testing.T) []byte {
	v := make([]byte, 1000)
	if _, err := rand.Read(v); err != nil {
		t.Fatal(err)
	}
	return v
}
