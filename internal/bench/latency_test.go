package bench

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkLatency offers 20,000 records/s for 5 s and reports the
// end-to-end latency a read_committed reader of the output sees (p50, p99),
// for raw franz-go loops and for Sluice at several checkpoint intervals.
func BenchmarkLatency(b *testing.B) {
	const (
		rate     = 20000
		duration = 5 * time.Second
	)
	loops := loops(50*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond)
	for _, l := range loops {
		b.Run(l.name, func(b *testing.B) {
			var lat []time.Duration
			for range b.N {
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
				if err != nil {
					b.Fatal(err)
				}
				brokers := c.ListenAddrs()[0]
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- l.run(ctx, brokers, "lat", b.TempDir()) }()
				lat = append(lat, measureLatency(b, brokers, rate, duration)...)
				cancel()
				<-done
				c.Close()
			}
			slices.Sort(lat)
			if len(lat) == 0 {
				b.Fatal("no output")
			}
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// measureLatency produces timestamped records at rate for d (after a
// warm-up record has made it through) and reads the output read_committed.
func measureLatency(b *testing.B, brokers string, rate int, d time.Duration) []time.Duration {
	lat, _ := measureLatencyOn(b, brokers, input, output, rate, d)
	return lat
}

// measureLatencyOn is measureLatency from topic in to topic out. Each
// record's value is the time it was produced in microseconds since the
// epoch, a base-10 integer, so that both jobs take it: echo copies it, and
// aggregate's running "max" of a key is its latest record's stamp (one
// producer, stamps rising). It returns the latencies and how many records
// were produced.
func measureLatencyOn(b *testing.B, brokers, in, out string, rate int, d time.Duration) ([]time.Duration, int) {
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer prod.Close()
	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(out),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	stamp := func() []byte { return []byte(strconv.FormatInt(time.Now().UnixMicro(), 10)) }

	// Warm up: wait until the loop is running end to end.
	warm := time.Now()
	for seen := false; !seen; {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: in, Key: []byte("warm"), Value: stamp()})
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := reader.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(*kgo.Record) { seen = true })
		if time.Since(warm) > time.Minute {
			b.Fatal("loop did not start")
		}
	}

	produced := make(chan int, 1)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		n := 0
		for time.Since(start) < d {
			<-tick.C
			// Catch up to the offered rate whatever the ticker's jitter.
			for due := int(time.Since(start).Seconds() * float64(rate)); n < due; n++ {
				prod.Produce(context.Background(), &kgo.Record{Topic: in, Key: []byte("k" + strconv.Itoa(n%1000)), Value: stamp()}, nil)
			}
		}
		produced <- n
	}()
	var lat []time.Duration
	want := -1
	deadline := time.Now().Add(d + 30*time.Second)
	for (want < 0 || len(lat) < want) && time.Now().Before(deadline) {
		select {
		case want = <-produced:
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := reader.PollFetches(ctx)
		cancel()
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == "warm" {
				return
			}
			if us, ok := stampOf(r.Value); ok {
				lat = append(lat, now.Sub(time.UnixMicro(us)))
			}
		})
	}
	return lat, want
}

// stampOf reads the produce stamp out of an output value: the value itself
// (echo, raw loops) or the "max" field of an aggregation.
func stampOf(v []byte) (int64, bool) {
	if i := bytes.Index(v, []byte(`"max":`)); i >= 0 {
		v = bytes.TrimSuffix(v[i+len(`"max":`):], []byte("}"))
	}
	us, err := strconv.ParseInt(string(v), 10, 64)
	return us, err == nil
}
