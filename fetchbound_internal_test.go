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

// An instance whose polls must hold several partitions (tasks in parallel,
// several input topics) raises the input consumer's bound to the largest
// batch read, rounded up to a power of two and at most the response's
// bound; a new session starts where the last one got to; a bound set in
// Options.ClientOpts stays as set; other instances keep the fixed bound.
func TestFetchBoundFollowsTheBatches(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	batch := func(n int) kgo.FetchBatchMetrics { return kgo.FetchBatchMetrics{NumRecords: 1, CompressedBytes: n} }
	for _, tc := range []struct {
		name        string
		parallelism int
		prefetch    bool
		topics      []string
		opts        []kgo.Opt
		read        []int // batch sizes read, in order
		want        int32 // the session's bound after them
		adapts      bool
	}{
		{"one task at a time", 1, false, []string{"a"}, nil, nil, 64 << 10, false},
		{"parallel, small batches", 2, false, []string{"a"}, nil, []int{100 << 10}, 128 << 10, true},
		{"parallel, 300 KB", 2, false, []string{"a"}, nil, []int{300_000}, 512 << 10, true},
		{"a 64 KiB batch and its header", 1, false, []string{"a", "b"}, nil, []int{64 << 10}, 128 << 10, true},
		{"never falls", 2, false, []string{"a"}, nil, []int{3 << 20, 300_000}, 4 << 20, true},
		{"two topics", 1, false, []string{"a", "b"}, nil, []int{300_000}, 512 << 10, true},
		{"a Prefetch job", 2, true, []string{"a"}, nil, []int{300_000}, 64 << 10, false},
		{"capped at the response's bound", 2, false, []string{"a"}, []kgo.Opt{kgo.FetchMaxBytes(256 << 10)}, []int{300_000}, 256 << 10, true},
		{"ClientOpts' own bound", 2, false, []string{"a"}, []kgo.Opt{kgo.FetchMaxPartitionBytes(32 << 10)}, []int{300_000}, 32 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := Job{Name: "noop", Process: func(Context, *Record) error { return nil }}
			if tc.prefetch {
				job.Prefetch = func(PrefetchContext, []*Record) error { return nil }
			}
			in, err := New(Options{Brokers: c.ListenAddrs(), AppID: "fb", InstanceID: "i", InputTopics: tc.topics,
				Job: job, StateDir: t.TempDir(), Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry(),
				ClientOpts: tc.opts, Parallelism: tc.parallelism})
			if err != nil {
				t.Fatal(err)
			}
			if (in.fetchBound != nil) != tc.adapts {
				t.Fatalf("bound follows the batches: %t, want %t", in.fetchBound != nil, tc.adapts)
			}
			in.batchMax = 1 << 20
			bound := func() int32 {
				s, err := in.newSession()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				for _, n := range tc.read {
					if in.fetchBound != nil {
						in.fetchBound.OnFetchBatchRead(kgo.BrokerMetadata{}, "a", 0, batch(n))
					}
				}
				return s.Client().OptValue(kgo.FetchMaxPartitionBytes).(int32)
			}
			if got := bound(); got != tc.want {
				t.Fatalf("after batches of %v bytes the bound is %d, want %d", tc.read, got, tc.want)
			}
			tc.read = nil
			if got := bound(); got != tc.want {
				t.Fatalf("the next session's bound is %d, want %d", got, tc.want)
			}
		})
	}
}
