package sluice_test

import (
	"context"
	"log/slog"
	"strconv"
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

// On the wall clock a task reads the processing time every few records,
// and OnTimer reads it afresh; the records after a timer must not see an
// earlier time than the timer did (found by review). So ctx.Now() never
// goes back within a task, across records and the event-time timers
// fired between them.
func TestProcessingTimeNeverGoesBack(t *testing.T) {
	const records = 5000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	base := time.Now().Add(-time.Hour)
	for i := range records {
		// Each record's timestamp a millisecond on: every record passes
		// the watermark over the timer the one before it set.
		cl.Produce(context.Background(), &kgo.Record{Key: []byte("k" + strconv.Itoa(i%50)), Value: []byte("1"), Timestamp: base.Add(time.Duration(i) * time.Millisecond)}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var last time.Time
	backwards, fired := 0, 0
	saw := func(now time.Time, timer bool) {
		mu.Lock()
		defer mu.Unlock()
		if now.Before(last) {
			backwards++
		}
		last = now
		if timer {
			fired++
		}
	}
	job := sluice.Job{Name: "nowcheck", EventTime: true, Timestamp: sluice.KafkaTime,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			saw(ctx.Now(), false)
			ctx.Timers().RegisterEventTime(rec.Timestamp)
			return nil
		},
		OnTimer: func(ctx sluice.Context, _ sluice.Timer) error {
			saw(ctx.Now(), true)
			return nil
		},
	}
	inst, err := sluice.New(sluice.Options{Brokers: c.ListenAddrs(), AppID: "now", InstanceID: "i1", Job: job,
		InputTopics: []string{"in"}, StateDir: t.TempDir(),
		Checkpoint:         barrier.Config{Interval: 50 * time.Millisecond, Timeout: 9 * time.Second, TolerableFailures: 3},
		TransactionTimeout: 60 * time.Second, SessionTimeout: 6 * time.Second,
		Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(time.Minute)
	for {
		offs, err := adm.FetchOffsets(context.Background(), "now")
		if err == nil {
			if o, ok := offs.Lookup("in", 0); ok && o.At == records {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not consumed within a minute (Run: %v)", <-done)
		}
		<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fired == 0 || backwards != 0 {
		t.Fatalf("%d timers fired; ctx.Now() went back %d times", fired, backwards)
	}
}
