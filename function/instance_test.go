package function_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
)

func errorAs(err error, target any) bool { return err != nil && errors.As(err, target) }

// run is one instance on a kfake cluster of its own, for tests that need
// the instance to stop by itself (sluicetest fails a test on that).
type run struct {
	brokers []string
	cl      *kgo.Client
	done    chan error
}

func startInstance(t *testing.T, job sluice.Job) *run {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out", "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r := &run{brokers: c.ListenAddrs(), done: make(chan error, 1)}
	r.cl, err = kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cl.Close)
	inst, err := sluice.New(sluice.Options{
		Brokers: r.brokers, AppID: "fn", InstanceID: "i1", Job: job,
		InputTopics: []string{"in"}, OutputTopic: "out", DLQTopic: "dlq",
		StateDir: t.TempDir(), Registry: prometheus.NewRegistry(),
		Checkpoint:         barrier.Config{Interval: 20 * time.Millisecond, Timeout: 9 * time.Second, TolerableFailures: 3},
		TransactionTimeout: 10 * time.Second, SessionTimeout: 6 * time.Second, RebalanceTimeout: 4 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { r.done <- inst.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("the instance did not stop")
		}
	})
	return r
}

// send produces one record per key, value "1", in order.
func (r *run) send(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if err := r.cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(k), Value: []byte("1")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// wait returns what Run returned.
func (r *run) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("the instance did not stop by itself")
		return nil
	}
}

// committed is the group's committed offset of the input (0: none).
func (r *run) committed(t *testing.T) int64 {
	t.Helper()
	offs, err := kadm.NewClient(r.cl).FetchOffsets(context.Background(), "fn")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup("in", 0); ok {
		return o.At
	}
	return 0
}
