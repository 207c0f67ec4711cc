package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/jobs"
)

const windowSensors = 1000

// readingsCluster preloads n sensor readings keyed by sensor id: every
// second each of windowSensors sensors reads once, so a 1-minute window
// holds 60 readings per sensor and n = 1,000,000 spans about 17 windows.
func readingsCluster(b *testing.B, n int) (string, func()) {
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
	const start = 1700000000
	for i := range n {
		id := fmt.Sprintf("sensor_%d", i%windowSensors)
		// Within 5 degrees of each other: temperature-alert never alerts,
		// so neither job's rate is its output's.
		v := fmt.Sprintf("%s,%d,%.1f", id, start+i/windowSensors, 20+float64((i/windowSensors+i%windowSensors)%50)/10)
		cl.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte(id), Value: []byte(v)}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	return brokers, c.Close
}

// BenchmarkWindowAverage compares window-average (1-minute tumbling
// windows in event time: per reading one window-index read and write, per
// window and sensor two timers and one output) with temperature-alert (per
// reading one state read and write) on the same 1,000,000 generated
// readings (none of which alerts, so output volume does not decide),
// exactly-once, 100 ms epochs, bbolt. Each iteration runs both,
// each on a fresh broker; records/s is from the first commit to the last
// (start-up excluded), and ratio is window-average's rate over
// temperature-alert's in the same run.
func BenchmarkWindowAverage(b *testing.B) {
	const n = 1000000
	mk := map[string]func() sluice.Job{
		"temperature-alert": func() sluice.Job { return jobs.TemperatureAlert(10) },
		"window-average":    func() sluice.Job { return jobs.WindowAverage(jobs.WindowAverageOptions{Window: time.Minute}) },
	}
	rate := map[string]float64{}
	for range b.N {
		for _, name := range []string{"temperature-alert", "window-average"} {
			b.StopTimer()
			brokers, stop := readingsCluster(b, n)
			inst, err := sluice.New(sluice.Options{
				Brokers: []string{brokers}, AppID: "bench", InstanceID: "bench", Job: mk[name](),
				InputTopics: []string{input}, OutputTopic: output, StateDir: b.TempDir(), Backend: "bbolt",
				Checkpoint:         barrier.Config{Interval: 100 * time.Millisecond, Timeout: 30 * time.Second, TolerableFailures: 3},
				TransactionTimeout: time.Minute, SessionTimeout: 45 * time.Second, RebalanceTimeout: 30 * time.Second,
				Registry: prometheus.NewRegistry(), Logger: benchLogger(),
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.StartTimer()
			go func() { done <- inst.Run(ctx) }()
			firstAt, firstSum := awaitCommitted(b, brokers, "bench", n)
			rate[name] += float64(int64(n)-firstSum) / time.Since(firstAt).Seconds()
			b.StopTimer()
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				b.Fatal(err)
			}
			stop()
		}
	}
	alert, win := rate["temperature-alert"]/float64(b.N), rate["window-average"]/float64(b.N)
	b.ReportMetric(alert, "alert-records/s")
	b.ReportMetric(win, "window-records/s")
	b.ReportMetric(win/alert, "ratio")
}
