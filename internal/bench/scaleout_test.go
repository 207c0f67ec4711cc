package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkScaleOut measures what adding an instance costs the tasks that
// move to it, with and without warm-up replicas
// (SLUICE_MAX_WARMUP_REPLICAS, with SLUICE_STANDBY_REPLICAS=1): one
// processor process of the aggregate job runs 4 partitions holding
// 1,000,000 keys; a second starts while 20,000 records/s keep arriving.
// Reported: the time from the second's start until each runs 2 tasks, the
// changelog records the second's restores read, and how long fewer than
// all 4 tasks were running (polled every 10 ms: the moving tasks' pause).
//
//	go test -run '^$' -bench ScaleOut -benchtime 1x ./internal/bench/
func BenchmarkScaleOut(b *testing.B) {
	for _, warmups := range []int{0, 2} {
		b.Run(fmt.Sprintf("warmups=%d", warmups), func(b *testing.B) { benchScaleOut(b, warmups) })
	}
}

func benchScaleOut(b *testing.B, warmups int) {
	const keys, partitions, rate = 1000000, 4, 20000
	bin := processorBinary(b)
	for range b.N {
		b.StopTimer()
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
		if err != nil {
			b.Fatal(err)
		}
		brokers := c.ListenAddrs()[0]
		start := func(id string) (addr string, stop func()) {
			cmd, addr := startProcessor(b, bin, brokers, "scaleout", id, "SLUICE_STANDBY_REPLICAS=1",
				"SLUICE_MAX_WARMUP_REPLICAS="+strconv.Itoa(warmups), "SLUICE_LOG_LEVEL=error")
			return addr, func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() }
		}
		preloadKeys(b, brokers, keys)
		addr1, stop1 := start("s1")
		sum := func(addr, name string) float64 { v, _ := metricSum(addr, name); return v }
		running := func(addr string) float64 { return sum(addr, `sluice_tasks{state="running"}`) }
		waitFor(b, "1M keys built on the first", 10*time.Minute, func() bool {
			return ready(addr1) && sum(addr1, "sluice_state_keys") >= keys && running(addr1) == partitions
		})

		// Input keeps arriving while the second joins.
		ctx, cancel := context.WithCancel(context.Background())
		prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		produced := make(chan struct{})
		go func() {
			defer close(produced)
			r := rand.New(rand.NewPCG(1, 2))
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				for range rate / 100 {
					i := r.IntN(keys)
					prod.Produce(ctx, &kgo.Record{Topic: input, Key: []byte(fmt.Sprintf("key-%07d", i)), Value: []byte(strconv.Itoa(i))}, nil)
				}
			}
		}()

		b.StartTimer()
		started := time.Now()
		addr2, stop2 := start("s2")
		var paused time.Duration
		last := time.Now()
		waitFor(b, "two tasks running on each", 10*time.Minute, func() bool {
			r1, r2 := running(addr1), running(addr2)
			now := time.Now()
			if r1+r2 < partitions {
				paused += now.Sub(last)
			}
			last = now
			<-time.After(10 * time.Millisecond) // sampling, in a benchmark
			return r1 == 2 && r2 == 2
		})
		end := time.Now()
		b.StopTimer()
		b.ReportMetric(end.Sub(started).Seconds(), "s-start-to-balanced")
		b.ReportMetric(sum(addr2, "sluice_restore_records_done"), "changelog-records-restored")
		b.ReportMetric(paused.Seconds(), "s-fewer-than-all-running")
		b.ReportMetric(sum(addr2, "sluice_warmup_rebalances_total"), "warmup-asks")
		cancel()
		<-produced
		prod.Close()
		stop2()
		stop1()
		c.Close()
	}
}
