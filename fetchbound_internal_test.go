package sluice

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/kstate"
)

// The input consumer bounds each partition's records in a fetch response
// (fetchMaxPartitionBytes, times Options.Parallelism up to 1 MiB, unless
// the job has a Prefetch), its
// producer lingers producerLinger, and a franz-go option in
// Options.ClientOpts wins over either.
func TestInputFetchBoundYieldsToClientOpts(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		parallelism int
		prefetch    bool
		opts        []kgo.Opt
		want        int32
		linger      time.Duration
	}{
		{0, false, nil, 64 << 10, producerLinger}, // the default, 1
		{1, false, nil, 64 << 10, producerLinger},
		{2, false, nil, 128 << 10, producerLinger},
		{16, false, nil, 1 << 20, producerLinger},
		{17, false, nil, 1 << 20, producerLinger},
		{math.MaxInt, false, nil, 1 << 20, producerLinger},
		{2, true, nil, 64 << 10, producerLinger}, // a Prefetch job is processed by one goroutine
		{1, false, []kgo.Opt{kgo.FetchMaxPartitionBytes(1 << 20), kgo.ProducerLinger(0)}, 1 << 20, 0},
		{2, false, []kgo.Opt{kgo.FetchMaxPartitionBytes(32 << 10)}, 32 << 10, producerLinger},
	} {
		job := Job{Name: "noop", Process: func(Context, *Record) error { return nil }}
		if tc.prefetch {
			job.Prefetch = func(PrefetchContext, []*Record) error { return nil }
		}
		in, err := New(Options{Brokers: c.ListenAddrs(), AppID: "fb", InstanceID: "i", InputTopics: []string{"in"},
			Job: job, StateDir: t.TempDir(),
			Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry(), ClientOpts: tc.opts, Parallelism: tc.parallelism})
		if err != nil {
			t.Fatal(err)
		}
		in.batchMax = 1 << 20
		s, err := in.newSession()
		if err != nil {
			t.Fatal(err)
		}
		got := s.Client().OptValue(kgo.FetchMaxPartitionBytes)
		linger := s.Client().OptValue(kgo.ProducerLinger)
		s.Close()
		if got != tc.want {
			t.Fatalf("parallelism %d (prefetch %t), ClientOpts %d options: the input consumer fetches up to %v bytes a partition, want %d", tc.parallelism, tc.prefetch, len(tc.opts), got, tc.want)
		}
		if linger != tc.linger {
			t.Fatalf("parallelism %d, ClientOpts %d options: the producer lingers %v, want %v", tc.parallelism, len(tc.opts), linger, tc.linger)
		}
	}
}
