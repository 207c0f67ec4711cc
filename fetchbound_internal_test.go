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
		in := fetchBoundInstance(t, c.ListenAddrs(), []string{"in"}, tc.parallelism, tc.prefetch, tc.opts)
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
// batch read, rounded up to a power of two and at most 1 MiB and the
// response's bound, and fetches without fetch sessions (in which kfake
// keeps the old bound for partitions a response skipped); a new session
// starts where the last one got to; a bound set in Options.ClientOpts
// stays as set in every session, and the sessions after the first keep
// franz-go's defaults; other instances keep the fixed bound.
func TestFetchBoundFollowsTheBatches(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name        string
		parallelism int
		prefetch    bool
		topics      []string
		opts        []kgo.Opt
		read, read2 []int // batch sizes read in the first session, and in the next
		want, want2 int32 // the bound after them
		adapts      bool
		pinned      bool // ClientOpts set the bound: sessions after the first keep franz-go's defaults
	}{
		{"one task at a time", 1, false, []string{"a"}, nil, nil, nil, 64 << 10, 64 << 10, false, false},
		{"parallel, small batches", 2, false, []string{"a"}, nil, []int{100 << 10}, nil, 128 << 10, 128 << 10, true, false},
		{"parallel, 300 KB", 2, false, []string{"a"}, nil, []int{300_000}, nil, 512 << 10, 512 << 10, true, false},
		{"a 64 KiB batch and its header", 1, false, []string{"a", "b"}, nil, []int{64 << 10}, nil, 128 << 10, 128 << 10, true, false},
		{"never falls", 2, false, []string{"a"}, nil, []int{900_000, 300_000}, []int{100_000}, 1 << 20, 1 << 20, true, false},
		{"raised in the next session", 2, false, []string{"a"}, nil, []int{200_000}, []int{300_000}, 256 << 10, 512 << 10, true, false},
		{"capped at 1 MiB", 2, false, []string{"a"}, nil, []int{3 << 20}, nil, 1 << 20, 1 << 20, true, false},
		{"two topics", 1, false, []string{"a", "b"}, nil, []int{300_000}, nil, 512 << 10, 512 << 10, true, false},
		{"a Prefetch job", 2, true, []string{"a"}, nil, []int{300_000}, nil, 64 << 10, 64 << 10, false, false},
		{"capped at the response's bound", 2, false, []string{"a"}, []kgo.Opt{kgo.FetchMaxBytes(256 << 10)}, []int{300_000}, nil, 256 << 10, 256 << 10, true, false},
		{"ClientOpts' own bound", 2, false, []string{"a"}, []kgo.Opt{kgo.FetchMaxPartitionBytes(32 << 10)}, []int{300_000}, nil, 32 << 10, 32 << 10, true, true},
		// The first session's batch would have raised the bound to the
		// one set, which the next session would then have taken for its
		// own (found by review).
		{"ClientOpts' own bound, reached", 2, false, []string{"a"}, []kgo.Opt{kgo.FetchMaxPartitionBytes(256 << 10)}, []int{200_000}, []int{300_000}, 256 << 10, 256 << 10, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := fetchBoundInstance(t, c.ListenAddrs(), tc.topics, tc.parallelism, tc.prefetch, tc.opts)
			if (in.fetchBound != nil) != tc.adapts {
				t.Fatalf("bound follows the batches: %t, want %t", in.fetchBound != nil, tc.adapts)
			}
			session := func(read []int, want int32, adapting bool) {
				t.Helper()
				s, err := in.newSession()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if off := s.Client().OptValue(kgo.DisableFetchSessions).(bool); off != adapting {
					t.Fatalf("fetch sessions off: %t, want %t", off, adapting)
				}
				for _, n := range read {
					if in.fetchBound != nil {
						in.fetchBound.OnFetchBatchRead(kgo.BrokerMetadata{}, "a", 0, kgo.FetchBatchMetrics{NumRecords: 1, CompressedBytes: n})
					}
				}
				if got := s.Client().OptValue(kgo.FetchMaxPartitionBytes).(int32); got != want {
					t.Fatalf("after batches of %v bytes the bound is %d, want %d", read, got, want)
				}
			}
			session(tc.read, tc.want, tc.adapts)
			session(tc.read2, tc.want2, tc.adapts && !tc.pinned)
		})
	}
}

// fetchBoundInstance is an instance of a job that does nothing, reading
// topics, whose sessions can be built without starting it (newSession).
func fetchBoundInstance(t *testing.T, brokers, topics []string, parallelism int, prefetch bool, opts []kgo.Opt) *Instance {
	t.Helper()
	job := Job{Name: "noop", Process: func(Context, *Record) error { return nil }}
	if prefetch {
		job.Prefetch = func(PrefetchContext, []*Record) error { return nil }
	}
	in, err := New(Options{Brokers: brokers, AppID: "fb", InstanceID: "i", InputTopics: topics,
		Job: job, StateDir: t.TempDir(), Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry(),
		ClientOpts: opts, Parallelism: parallelism})
	if err != nil {
		t.Fatal(err)
	}
	in.batchMax = 1 << 20 // read from the topics at start, which these sessions skip
	return in
}
