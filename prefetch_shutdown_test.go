package sluice_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
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

// A shutdown that lands while Prefetch waits on its service (cancelled by
// the instance's context) still takes the final checkpoint of the work
// already done. (Found by review: the cancelled call's error stopped the
// loop before it.)
func TestShutdownDuringPrefetchTakesFinalCheckpoint(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	processed, blocking := make(chan struct{}), make(chan struct{})
	var once sync.Once
	job := sluice.Job{Name: "pf", Emits: true,
		Prefetch: func(ctx sluice.PrefetchContext, recs []*sluice.Record) error {
			if string(recs[0].Value) == "block" {
				close(blocking)
				<-ctx.Context().Done() // a call in flight at shutdown
				return ctx.Context().Err()
			}
			return nil
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			once.Do(func() { close(processed) })
			ctx.Emit(rec.Key, rec.Value)
			return nil
		}}
	inst, err := sluice.New(sluice.Options{Brokers: brokers, AppID: "pf", InstanceID: "i1", Job: job,
		InputTopics: []string{"in"}, OutputTopic: "out", StateDir: filepath.Join(t.TempDir(), "s"),
		Checkpoint:         barrier.Config{Interval: 30 * time.Second, Timeout: 9 * time.Second, TolerableFailures: 3},
		TransactionTimeout: 60 * time.Second, SessionTimeout: 6 * time.Second,
		Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("k"), Value: []byte("1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	<-processed
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("k"), Value: []byte("block")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	<-blocking
	cancel()
	err = <-done
	offs, ferr := kadm.NewClient(cl).FetchOffsets(context.Background(), "pf")
	if ferr != nil {
		t.Fatal(ferr)
	}
	o, _ := offs.Lookup("in", 0)
	if o.At != 1 {
		t.Fatalf("after a graceful stop during Prefetch (Run: %v) the group's offset is %d, want 1: the final checkpoint was skipped", err, o.At)
	}
}
