package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/txsink/pgsink"
)

// BenchmarkSink is the aggregate job exactly-once into PostgreSQL
// (txsink/pgsink, one row per key upserted per epoch) against the same job
// into Kafka only, on the same run: 500,000 preloaded records, 10,000
// keys, 4 partitions, 100 ms epochs, one instance; records/s from the first
// commit to the last. The server runs with fsync on, as in production. The
// last row takes 1 s epochs instead: each epoch upserts one row per key it
// touched, so longer epochs merge more records into each row. It reads
// 5,000,000 records: 500,000 took less than its first epoch, which left
// almost nothing to time after the first commit. The
// pipelined row processes each epoch while the one before commits
// (Options.PipelinedEpochs): the Kafka flush and the sink's pre-commit
// overlap the next epoch.
//
// go test -run '^$' -bench Sink -benchtime 3x ./internal/bench
func BenchmarkSink(b *testing.B) {
	srv := pgtest.Start(b, "fsync = on")
	dbs := 0
	for _, run := range []struct {
		to        string
		interval  time.Duration
		pipelined bool
	}{
		{"kafka", 100 * time.Millisecond, false},
		{"postgres", 100 * time.Millisecond, false},
		{"kafka+postgres", 100 * time.Millisecond, false},
		{"kafka+postgres", 100 * time.Millisecond, true},
		{"postgres", time.Second, false},
	} {
		to := run.to
		name := fmt.Sprintf("aggregate-%s-%v", to, run.interval)
		if run.pipelined {
			name += "-pipelined"
		}
		n := 500000
		if run.interval >= time.Second {
			n = 5000000
		}
		b.Run(name, func(b *testing.B) {
			var steady time.Duration
			var steadyRecords int64
			for range b.N {
				b.StopTimer()
				brokers, stop := cluster(b, n)
				var sink *pgsink.Sink
				if to != "kafka" {
					dbs++
					var err error
					sink, err = pgsink.New(pgsink.Config{URL: srv.Database(b, fmt.Sprintf("bench%d", dbs)), App: "bench", Table: "aggregates",
						Columns: pgsink.Named(jobs.AggregateColumns, pgsink.Text, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt),
						Key:     jobs.AggregateColumns[:1], Logger: benchLogger()})
					if err != nil {
						b.Fatal(err)
					}
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				b.StartTimer()
				go func() { done <- sinkLoop(ctx, brokers, "bench", b.TempDir(), to, run.interval, run.pipelined, sink) }()
				firstAt, firstSum := awaitCommitted(b, brokers, "bench", n)
				steady += time.Since(firstAt)
				steadyRecords += int64(n) - firstSum
				b.StopTimer()
				cancel()
				if err := <-done; err != nil && ctx.Err() == nil {
					b.Fatal(err)
				}
				if sink != nil {
					sink.Close()
				}
				stop()
			}
			b.ReportMetric(float64(steadyRecords)/steady.Seconds(), "records/s")
		})
	}
}

func sinkLoop(ctx context.Context, brokers, group, dir, to string, interval time.Duration, pipelined bool, sink *pgsink.Sink) error {
	opts := sluice.Options{
		Brokers: []string{brokers}, AppID: group, InstanceID: "bench",
		Job:         jobs.AggregateWith(jobs.AggregateOptions{Emit: to != "postgres", Rows: sink != nil}),
		InputTopics: []string{input}, StateDir: dir, Backend: "bbolt", Guarantee: sluice.ExactlyOnce,
		Checkpoint:         barrier.Config{Interval: interval, Timeout: 30 * time.Second, TolerableFailures: 3},
		TransactionTimeout: time.Minute, SessionTimeout: 45 * time.Second, RebalanceTimeout: 30 * time.Second,
		Registry: prometheus.NewRegistry(), Logger: benchLogger(),
		PipelinedEpochs: pipelined,
	}
	if to != "postgres" {
		opts.OutputTopic = output
	}
	if sink != nil {
		opts.Sink = sink
	}
	inst, err := sluice.New(opts)
	if err != nil {
		return err
	}
	return inst.Run(ctx)
}
