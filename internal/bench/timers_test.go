package bench

import (
	"context"
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
	"github.com/sluicehq/sluice/kstate"
)

const timerKeys = 100000

var (
	seen = kstate.Value[int64]("seen", kstate.Int64())
	// pad is what the job without timers writes instead of a timer, so
	// that both jobs run over stores of the same size.
	pad = kstate.Value[int64]("pad", kstate.Int64())
)

// timerJob counts records per key and emits the count; with arm, the first
// record of a key registers a processing-time timer at fireAt, and the
// timer emits one record; without, it writes one more state entry.
func timerJob(arm bool, fireAt time.Time) sluice.Job {
	return sluice.Job{
		Name: "timers", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			n, _, err := seen.Get(ctx)
			if err != nil {
				return err
			}
			n++
			if err := seen.Set(ctx, n); err != nil {
				return err
			}
			switch {
			case n == 1 && arm:
				ctx.Timers().RegisterProcessingTime(fireAt)
			case n == 1:
				if err := pad.Set(ctx, fireAt.UnixMilli()); err != nil {
					return err
				}
			}
			ctx.Emit(rec.Key, rec.Value)
			return nil
		},
		OnTimer: func(ctx sluice.Context, t sluice.Timer) error {
			ctx.Emit(t.Key, []byte("fired"))
			return nil
		},
	}
}

// timerCluster preloads one record per key (the warm-up, which arms the
// timers) followed by n records over the same keys.
func timerCluster(b *testing.B, n int) (string, func()) {
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
	for i := range timerKeys + n {
		cl.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte("k" + strconv.Itoa(i%timerKeys)), Value: []byte(strconv.Itoa(i))}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	return brokers, c.Close
}

// committedSum is the sum of the group's committed offsets, 0 while it
// cannot be read.
func committedSum(adm *kadm.Client, group string) int64 {
	sum, _ := check.CommittedSum(context.Background(), adm, group)
	return sum
}

// gaugeSum sums a gauge's series in reg.
func gaugeSum(reg *prometheus.Registry, name string) float64 {
	sum, _ := check.MetricSum(reg, name)
	return sum
}

// BenchmarkTimers measures what processing-time timers on 100,000 keys
// cost. Per iteration a broker is preloaded with one record per key (the
// warm-up) and then 1,000,000 records over the same keys; the job counts
// per key and emits. In "armed" the warm-up registers one timer per key,
// all at the same instant a few seconds ahead, so the 1,000,000 records are
// processed with 100,000 timers registered and none due; "none" writes an
// entry of plain state per key instead, so both stores hold as many keys.
// records/s is the rate after the warm-up committed; compare the two. In "armed", fire-ms is the time from the timers' instant until all
// 100,000 have fired and committed (sluice_timers back to 0).
func BenchmarkTimers(b *testing.B) {
	const n = 1000000
	for _, arm := range []bool{false, true} {
		name := "none"
		if arm {
			name = "armed"
		}
		b.Run(name, func(b *testing.B) {
			var steady, fire time.Duration
			for range b.N {
				b.StopTimer()
				brokers, stop := timerCluster(b, n)
				cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
				if err != nil {
					b.Fatal(err)
				}
				adm := kadm.NewClient(cl)
				reg := prometheus.NewRegistry()
				// Far enough ahead that the 1,000,000 records are done
				// before the timers are due.
				fireAt := time.Now().Add(20 * time.Second)
				inst, err := sluice.New(sluice.Options{
					Brokers: []string{brokers}, AppID: "bench", InstanceID: "bench", Job: timerJob(arm, fireAt),
					InputTopics: []string{input}, OutputTopic: output, StateDir: b.TempDir(), Backend: "bbolt",
					Checkpoint:         barrier.Config{Interval: 100 * time.Millisecond, Timeout: 30 * time.Second, TolerableFailures: 3},
					TransactionTimeout: time.Minute, SessionTimeout: 45 * time.Second, RebalanceTimeout: 30 * time.Second,
					Registry: reg, Logger: benchLogger(),
				})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- inst.Run(ctx) }()
				b.StartTimer()
				var warmAt time.Time
				for committedSum(adm, "bench") < timerKeys+n {
					if warmAt.IsZero() && committedSum(adm, "bench") >= timerKeys {
						warmAt = time.Now()
					}
					<-time.After(5 * time.Millisecond)
				}
				if time.Now().After(fireAt) {
					b.Fatalf("the records took past the timers' instant; raise it")
				}
				steady += time.Since(warmAt)
				b.StopTimer()
				if arm {
					if got := gaugeSum(reg, "sluice_timers"); got != timerKeys {
						b.Fatalf("%v timers registered, want %d", got, timerKeys)
					}
					for gaugeSum(reg, "sluice_timers") > 0 {
						<-time.After(5 * time.Millisecond)
					}
					fire += time.Since(fireAt)
				}
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				cl.Close()
				stop()
			}
			b.ReportMetric(float64(n*b.N)/steady.Seconds(), "records/s")
			if arm {
				b.ReportMetric(float64(fire.Milliseconds())/float64(b.N), "fire-ms")
			}
		})
	}
}
