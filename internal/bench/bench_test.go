package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/jobs"
)

const (
	partitions = 4
	input      = "in"
	output     = "out"
)

// cluster starts a broker preloaded with n small keyed records.
func cluster(b *testing.B, n int) (string, func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
	if err != nil {
		b.Fatal(err)
	}
	brokers := c.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte("k" + strconv.Itoa(i%10000)), Value: []byte(strconv.Itoa(i))}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	return brokers, c.Close
}

// awaitCommitted waits until the group committed n input offsets in all,
// and returns when its first commit was seen and with how many offsets,
// so that start-up (joining, restoring) can be left out of the rate.
func awaitCommitted(b *testing.B, brokers, group string, n int) (firstAt time.Time, firstSum int64) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		sum, err := check.CommittedSum(context.Background(), adm, group)
		if err == nil {
			if sum > 0 && firstAt.IsZero() {
				firstAt, firstSum = time.Now(), sum
			}
			if sum >= int64(n) {
				return firstAt, firstSum
			}
		}
		<-time.After(10 * time.Millisecond)
	}
	b.Fatalf("group %s did not commit %d offsets", group, n)
	return
}

// rawLoop is the baseline: franz-go consume→produce to the same partition,
// committing every interval, exactly-once (GroupTransactSession) or
// at-least-once (flush, then commit).
func rawLoop(ctx context.Context, brokers, group string, eos bool, interval time.Duration) error {
	return rawLoopOn(ctx, brokers, group, input, output, eos, interval)
}

// rawLoopOn is rawLoop from topic in to topic out, with extra options for
// its client.
func rawLoopOn(ctx context.Context, brokers, group, in, out string, eos bool, interval time.Duration, extra ...kgo.Opt) error {
	return rawLoopWith(ctx, brokers, group, in, out, eos, interval, nil, extra...)
}

// rawLoopWith is rawLoopOn whose outputs' values are work's (nil: the
// input's value, as rawLoopOn).
func rawLoopWith(ctx context.Context, brokers, group, in, out string, eos bool, interval time.Duration, work func(r *kgo.Record) ([]byte, error), extra ...kgo.Opt) error {
	value := func(r *kgo.Record) ([]byte, error) { return r.Value, nil }
	if work != nil {
		value = work
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(brokers), kgo.ConsumerGroup(group), kgo.ConsumeTopics(in),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DisableAutoCommit(),
	}, extra...)
	if eos {
		opts = append(opts, kgo.TransactionalID(group+"-raw"))
		s, err := kgo.NewGroupTransactSession(opts...)
		if err != nil {
			return err
		}
		defer s.Close()
		for ctx.Err() == nil {
			// The transaction opens with the interval's first record,
			// and an interval that polled nothing ends none: ending a
			// transaction that committed no offsets makes franz-go hold
			// the session's lock for 500 ms (for want of knowing the
			// broker has KIP-447), which the next End then waits out.
			// Found in a trace of this loop: 0.5–1 s of a 3 s run.
			begun := false
			end := time.Now().Add(interval)
			for time.Now().Before(end) && ctx.Err() == nil {
				pctx, cancel := context.WithDeadline(ctx, end)
				fs := s.PollRecords(pctx, 10000)
				cancel()
				if fs.NumRecords() > 0 && !begun {
					if err := s.Begin(); err != nil {
						return err
					}
					begun = true
				}
				if err := produceEach(fs, out, value, func(r *kgo.Record) { s.Produce(ctx, r, nil) }); err != nil {
					return err
				}
			}
			if !begun {
				continue
			}
			if _, err := s.End(context.Background(), kgo.TryCommit); err != nil {
				return err
			}
		}
		return nil
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		end := time.Now().Add(interval)
		for time.Now().Before(end) && ctx.Err() == nil {
			pctx, cancel := context.WithDeadline(ctx, end)
			fs := cl.PollRecords(pctx, 10000)
			cancel()
			if err := produceEach(fs, out, value, func(r *kgo.Record) { cl.Produce(ctx, r, nil) }); err != nil {
				return err
			}
		}
		if err := cl.Flush(context.Background()); err != nil {
			return err
		}
		if err := cl.CommitUncommittedOffsets(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

// produceEach hands produce an output for every record of fs: to topic
// out, the record's partition and key, value's value.
func produceEach(fs kgo.Fetches, out string, value func(*kgo.Record) ([]byte, error), produce func(*kgo.Record)) error {
	for it := fs.RecordIter(); !it.Done(); {
		r := it.Next()
		v, err := value(r)
		if err != nil {
			return err
		}
		produce(&kgo.Record{Topic: out, Partition: r.Partition, Key: r.Key, Value: v})
	}
	return nil
}

// rawAggregate is the aggregate job's work done by hand, as a loop of
// one's own would do it: count, sum, min and max per key in a Go map (in
// memory only: nothing survives a restart), and each input's running
// aggregation as the job's output, {"count":C,"sum":S,"min":m,"max":M}.
// Beside Sluice's aggregate it prices the job's own work (the parse, the
// lookup, an output of some 50 bytes where the raw loop copies a value of
// up to 7) apart from what Sluice adds to it (keyed state in bbolt, the
// changelog, the epoch's transaction).
func rawAggregate() func(r *kgo.Record) ([]byte, error) {
	type agg struct{ count, sum, min, max int64 }
	byKey := map[string]*agg{}
	return func(r *kgo.Record) ([]byte, error) {
		v, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			return nil, err
		}
		a := byKey[string(r.Key)]
		if a == nil {
			a = &agg{min: v, max: v}
			byKey[string(r.Key)] = a
		}
		a.count++
		a.sum += v
		a.min, a.max = min(a.min, v), max(a.max, v)
		b := make([]byte, 0, 64)
		b = append(b, `{"count":`...)
		b = strconv.AppendInt(b, a.count, 10)
		b = append(b, `,"sum":`...)
		b = strconv.AppendInt(b, a.sum, 10)
		b = append(b, `,"min":`...)
		b = strconv.AppendInt(b, a.min, 10)
		b = append(b, `,"max":`...)
		b = strconv.AppendInt(b, a.max, 10)
		return append(b, '}'), nil
	}
}

func sluiceLoop(ctx context.Context, brokers, group, job string, g sluice.Guarantee, interval time.Duration, dir string) error {
	return sluiceLoopWith(ctx, sluiceOptions(brokers, group, input, output, job, "bbolt", g, interval, dir, prometheus.NewRegistry()))
}

// sluiceOptions are the options of every Sluice contender: one instance
// running job from topic in to topic out.
func sluiceOptions(brokers, group, in, out, job, backend string, g sluice.Guarantee, interval time.Duration, dir string, reg *prometheus.Registry) sluice.Options {
	j := jobs.Echo()
	switch job {
	case "aggregate":
		j = jobs.Aggregate()
	case "hash":
		j = hashJob()
	}
	return sluice.Options{
		Brokers: []string{brokers}, AppID: group, InstanceID: "bench", Job: j,
		InputTopics: []string{in}, OutputTopic: out, StateDir: dir, Backend: backend, Guarantee: g,
		Checkpoint:         barrier.Config{Interval: interval, Timeout: 30 * time.Second, TolerableFailures: 3},
		TransactionTimeout: time.Minute, SessionTimeout: 45 * time.Second, RebalanceTimeout: 30 * time.Second,
		Registry: reg, Logger: benchLogger(),
	}
}

// hashJob is echo with processing that costs CPU, as parsing, enrichment
// or scoring would: each output is the SHA-256 of its input's value hashed
// again 32 times (some 5 µs here). It shows what Options.Parallelism
// gives a job whose processing, not the broker, is the bound.
func hashJob() sluice.Job { return slowHashJob(32) }

func sluiceLoopWith(ctx context.Context, o sluice.Options) error {
	inst, err := sluice.New(o)
	if err != nil {
		return err
	}
	return inst.Run(ctx)
}

// loop is one consume→produce loop under test.
type loop struct {
	name string
	run  func(ctx context.Context, brokers, group, dir string) error
}

// loops are the loops both benchmarks compare: the raw franz-go baselines,
// Sluice echo at-least-once, and Sluice echo exactly-once at each interval.
func loops(intervals ...time.Duration) []loop {
	ls := []loop{
		{"raw-alos-100ms", func(ctx context.Context, br, g, _ string) error {
			return rawLoop(ctx, br, g, false, 100*time.Millisecond)
		}},
		{"raw-eos-100ms", func(ctx context.Context, br, g, _ string) error {
			return rawLoop(ctx, br, g, true, 100*time.Millisecond)
		}},
		{"sluice-echo-alos-100ms", func(ctx context.Context, br, g, dir string) error {
			return sluiceLoop(ctx, br, g, "echo", sluice.AtLeastOnce, 100*time.Millisecond, dir)
		}},
	}
	for _, iv := range intervals {
		ls = append(ls, loop{fmt.Sprintf("sluice-echo-eos-%v", iv), func(ctx context.Context, br, g, dir string) error {
			return sluiceLoop(ctx, br, g, "echo", sluice.ExactlyOnce, iv, dir)
		}})
	}
	return ls
}

// BenchmarkThroughput processes 1,000,000 preloaded records per iteration
// and reports records/s for each loop from its first commit to its last
// (start-up excluded), plus the whole run including start-up; compare the
// sluice rows with the raw rows of the same run.
func BenchmarkThroughput(b *testing.B) {
	const n = 1000000
	loops := loops(50*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond, 500*time.Millisecond)
	loops = append(loops, loop{"sluice-aggregate-eos-100ms", func(ctx context.Context, br, g, dir string) error {
		return sluiceLoop(ctx, br, g, "aggregate", sluice.ExactlyOnce, 100*time.Millisecond, dir)
	}})
	for _, l := range loops {
		b.Run(l.name, func(b *testing.B) {
			var total, steady time.Duration
			var steadyRecords int64
			for range b.N {
				b.StopTimer()
				brokers, stop := cluster(b, n)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				b.StartTimer()
				start := time.Now()
				go func() { done <- l.run(ctx, brokers, "bench", b.TempDir()) }()
				firstAt, firstSum := awaitCommitted(b, brokers, "bench", n)
				total += time.Since(start)
				steady += time.Since(firstAt)
				steadyRecords += int64(n) - firstSum
				b.StopTimer()
				cancel()
				if err := <-done; err != nil && ctx.Err() == nil {
					b.Fatal(err)
				}
				stop()
			}
			b.ReportMetric(float64(steadyRecords)/steady.Seconds(), "records/s")
			b.ReportMetric(float64(n*b.N)/total.Seconds(), "records/s-with-startup")
		})
	}
}

func benchLogger() *slog.Logger {
	if os.Getenv("BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
