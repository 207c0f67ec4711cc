package bench

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/examples/function-go/aggregate"
	"github.com/sluicehq/sluice/function"
	"github.com/sluicehq/sluice/function/sdk"
)

// functionLoop runs the aggregate as a sidecar function: the Go SDK's
// example served over loopback TCP in this process, the function job
// calling it with protocol p and batch records per call.
func functionLoop(ctx context.Context, brokers, group, dir string, p function.Protocol, batch int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go sdk.Serve(ln, sdk.Handler(aggregate.Declaration, aggregate.Func))
	reg := prometheus.NewRegistry()
	job, err := function.New(ctx, function.Options{URL: "http://" + ln.Addr().String(), Protocol: p, Batch: batch, Registry: reg, Logger: benchLogger()})
	if err != nil {
		return err
	}
	inst, err := sluice.New(sluice.Options{
		Brokers: []string{brokers}, AppID: group, InstanceID: "bench", Job: job,
		InputTopics: []string{input}, OutputTopic: output, StateDir: dir, Backend: "bbolt", Guarantee: sluice.ExactlyOnce,
		Checkpoint:         barrier.Config{Interval: 100 * time.Millisecond, Timeout: 30 * time.Second, TolerableFailures: 3},
		TransactionTimeout: time.Minute, SessionTimeout: 45 * time.Second, RebalanceTimeout: 30 * time.Second,
		Registry: reg, Logger: benchLogger(),
	})
	if err != nil {
		return err
	}
	return inst.Run(ctx)
}

// steadyRate runs l over n preloaded records on a fresh broker and returns
// its records/s from its first commit to its last.
func steadyRate(b *testing.B, n int, run func(ctx context.Context, brokers, group, dir string) error) float64 {
	b.StopTimer()
	brokers, stop := cluster(b, n)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	go func() { done <- run(ctx, brokers, "bench", b.TempDir()) }()
	firstAt, firstSum := awaitCommitted(b, brokers, "bench", n)
	rate := float64(int64(n)-firstSum) / time.Since(firstAt).Seconds()
	b.StopTimer()
	cancel()
	if err := <-done; err != nil && ctx.Err() == nil {
		b.Fatal(err)
	}
	return rate
}

// BenchmarkFunctionAggregate compares, in the same run, the aggregate job
// in process with the aggregate as a Go SDK function over loopback (the
// sidecar mode), exactly-once, 100ms epochs, 200,000 preloaded records over
// 10,000 keys; it reports both rates and their ratio (the target is at
// least 0.5) for each protocol and batch size.
func BenchmarkFunctionAggregate(b *testing.B) {
	const n = 200000
	for _, tc := range []struct {
		p     function.Protocol
		batch int
	}{{function.Proto, 500}, {function.JSON, 500}} {
		b.Run(fmt.Sprintf("%s-batch%d", tc.p, tc.batch), func(b *testing.B) {
			var inproc, fn float64
			for range b.N {
				inproc += steadyRate(b, n, func(ctx context.Context, br, g, dir string) error {
					return sluiceLoop(ctx, br, g, "aggregate", sluice.ExactlyOnce, 100*time.Millisecond, dir)
				})
				fn += steadyRate(b, n, func(ctx context.Context, br, g, dir string) error {
					return functionLoop(ctx, br, g, dir, tc.p, tc.batch)
				})
			}
			b.ReportMetric(inproc/float64(b.N), "inprocess-records/s")
			b.ReportMetric(fn/float64(b.N), "function-records/s")
			b.ReportMetric(fn/inproc, "ratio")
		})
	}
}
