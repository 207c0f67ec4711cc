package sluice_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
)

// inputCluster starts a one-broker cluster with topics "in" and "out" of
// partitions each, produces recs to "in", and returns the brokers and an
// admin client of the cluster.
func inputCluster(t testing.TB, partitions int32, recs []*kgo.Record) ([]string, *kadm.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for _, r := range recs {
		cl.Produce(context.Background(), r, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c.ListenAddrs(), kadm.NewClient(cl)
}

// testOptions are an instance's options for these tests: the job reads
// "in", 50 ms epochs, a registry of its own.
func testOptions(brokers []string, app string, job sluice.Job, state string) sluice.Options {
	return sluice.Options{Brokers: brokers, AppID: app, InstanceID: "i1", Job: job,
		InputTopics: []string{"in"}, StateDir: state,
		Checkpoint:         barrier.Config{Interval: 50 * time.Millisecond, Timeout: 9 * time.Second, TolerableFailures: 3},
		TransactionTimeout: 60 * time.Second, SessionTimeout: 6 * time.Second,
		Registry: prometheus.NewRegistry()}
}

// runUntil runs an instance of opts until until reports true (polled,
// within a minute), then stops it; Run must end without an error.
func runUntil(t *testing.T, opts sluice.Options, until func(*sluice.Instance) bool) {
	t.Helper()
	inst, err := sluice.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for !until(inst) {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not done within a minute (Run: %v)", <-done)
		}
		<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// consumedAll reports whether group's committed offsets add up to n.
func consumedAll(adm *kadm.Client, group string, n int64) func(*sluice.Instance) bool {
	return func(*sluice.Instance) bool {
		offs, err := adm.FetchOffsets(context.Background(), group)
		if err != nil {
			return false
		}
		sum := int64(0)
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		return sum == n
	}
}

// runInBackground runs inst in a goroutine until stop, which the test's
// cleanup also calls: Run must then return nil.
func runInBackground(tb testing.TB, inst *sluice.Instance) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Error(err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
