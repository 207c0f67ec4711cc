package sluice_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// seen counts records per key; the runtime scopes it to the record's key.
var seen = kstate.Value[int64]("seen", kstate.Int64())

// A job that counts records per key and emits the running count, run
// against an in-process broker.
func Example() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "clicks", "counts"))
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	job := sluice.Job{Name: "count", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		n, _, err := seen.Get(ctx)
		if err != nil {
			return err
		}
		n++
		if err := seen.Set(ctx, n); err != nil {
			return err
		}
		ctx.Emit(rec.Key, []byte(strconv.FormatInt(n, 10)))
		return nil
	}}
	inst, err := sluice.New(sluice.Options{
		Brokers: brokers, AppID: "counter", InstanceID: "example-1", Job: job,
		InputTopics: []string{"clicks"}, OutputTopic: "counts",
		Backend: "memory", // the defaults do the rest: exactly-once, 100ms epochs, derived timeouts
		Logger:  exampleLogger(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- inst.Run(ctx) }()

	prod, _ := kgo.NewClient(kgo.SeedBrokers(brokers...))
	defer prod.Close()
	for _, user := range []string{"ann", "bob", "ann"} {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: "clicks", Key: []byte(user), Value: []byte("click")})
	}
	// Read the output as any exactly-once consumer must: read_committed.
	reader, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("counts"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer reader.Close()
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for read := 0; read < 3 && rctx.Err() == nil; {
		fetches := reader.PollFetches(rctx)
		fetches.EachRecord(func(r *kgo.Record) {
			fmt.Printf("%s=%s\n", r.Key, r.Value)
			read++
		})
	}
	stop()
	<-done
	// Output:
	// ann=1
	// bob=1
	// ann=2
}

func exampleLogger() *slog.Logger {
	if os.Getenv("EXAMPLE_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
