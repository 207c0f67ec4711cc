package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// BenchmarkLargeBatches is tasks in parallel (Options.Parallelism) over an
// input written in record batches of about 300 KB, as franz-go's producer
// writes them under load: 4 partitions of 15,000 records of 1,000 random
// bytes, 300 to a batch, preloaded on an in-process broker. The job costs
// some 50 µs of CPU a record (SHA-256 hashed 512 times), so that the
// workers, not the broker, are the bound. records/s from the start of Run
// until the group committed every input; compare parallelism 2 with 1.
// Batches this large are over the fetch bound of 64 KiB × Parallelism, so
// each fetch response held one batch, one task, until the bound followed
// the batches (fetchBound).
func BenchmarkLargeBatches(b *testing.B) {
	const perPartition, perBatch = 15000, 300
	for _, par := range []int{1, 2} {
		b.Run(fmt.Sprintf("parallelism-%d", par), func(b *testing.B) {
			var took time.Duration
			for range b.N {
				b.StopTimer()
				brokers, stop := largeBatchCluster(b, perPartition, perBatch)
				cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
				if err != nil {
					b.Fatal(err)
				}
				adm := kadm.NewClient(cl)
				o := sluiceOptions(brokers, "bench", input, output, "echo", kstate.MemoryBackend, sluice.ExactlyOnce,
					100*time.Millisecond, b.TempDir(), prometheus.NewRegistry())
				o.Job, o.Parallelism = slowHashJob(512), par
				inst, err := sluice.New(o)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				b.StartTimer()
				start := time.Now()
				go func() { done <- inst.Run(ctx) }()
				for committedSum(adm, "bench") < partitions*perPartition {
					<-time.After(5 * time.Millisecond)
				}
				took += time.Since(start)
				b.StopTimer()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				cl.Close()
				stop()
			}
			b.ReportMetric(float64(partitions*perPartition*b.N)/took.Seconds(), "records/s")
		})
	}
}

// largeBatchCluster preloads perPartition records of 1,000 random bytes
// into each partition of the input, flushed every perBatch records of a
// partition, so that each flush writes one batch a partition.
func largeBatchCluster(b *testing.B, perPartition, perBatch int) (string, func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
	if err != nil {
		b.Fatal(err)
	}
	brokers := c.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ManualFlushing(), kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(1<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	for range perPartition / perBatch {
		for p := range int32(partitions) {
			for range perBatch {
				v := make([]byte, 1000) // random: a batch stays 300 KB compressed
				if _, err := rand.Read(v); err != nil {
					b.Fatal(err)
				}
				cl.Produce(context.Background(), &kgo.Record{Topic: input, Partition: p, Value: v}, nil)
			}
		}
		if err := cl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	return brokers, c.Close
}

// slowHashJob emits the SHA-256 of each input's value hashed again rounds
// times: a job whose own CPU is the bound.
func slowHashJob(rounds int) sluice.Job {
	return sluice.Job{Name: "hash", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		sum := sha256.Sum256(rec.Value)
		for range rounds {
			sum = sha256.Sum256(sum[:])
		}
		ctx.Emit(rec.Key, sum[:])
		return nil
	}}
}
