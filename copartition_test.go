package sluice_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// A transactional input whose tail holds more than its last commit marker
// (an aborted transaction: its records, which a read_committed consumer
// never gets, and its abort marker) is caught up once its data is taken:
// the other input's later records go on at once. They used to wait
// Options.MaxTaskIdle, here far longer than the test waits.
func TestCoProcessingDoesNotWaitForMarkers(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a", "b", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("upstream"), kgo.DefaultProduceTopic("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	base := time.Now().Add(-time.Hour)
	for i, end := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		v := map[kgo.TransactionEndTry]string{kgo.TryCommit: "a-committed", kgo.TryAbort: "a-aborted"}[end]
		r := &kgo.Record{Key: []byte("k"), Value: []byte(v), Timestamp: base.Add(time.Duration(i) * time.Second)}
		if err := tx.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	plain, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("b-later"), Timestamp: base.Add(time.Minute)}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	job := sluice.Job{Name: "both", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, rec.Value)
			return nil
		}}
	opts := testOptions(brokers, "markers", job, t.TempDir())
	opts.InputTopics, opts.OutputTopic = []string{"a", "b"}, "out"
	opts.MaxTaskIdle = time.Hour
	var mu sync.Mutex
	var msgs []string
	logged := messages{mu: &mu, msgs: &msgs}
	opts.Logger = slog.New(logged)
	startReady(t, opts)
	want := []string{"a-committed", "b-later"}
	read := func() {
		t.Helper()
		out, err := check.ReadCommitted(context.Background(), brokers, "out", 30*time.Second, check.Settled(len(want)))
		if err != nil {
			t.Fatal(err)
		}
		var vals []string
		for _, r := range out {
			vals = append(vals, string(r.Value))
		}
		if got := strings.Join(vals, ","); got != strings.Join(want, ",") {
			t.Fatalf("outputs %s, want %s", got, strings.Join(want, ","))
		}
	}
	read()

	// More transactions upstream, each followed by a plain record: the
	// task's offsets step past each marker with the consumer, so no
	// checkpoint finds them apart (they were, at every transaction end,
	// and each was logged as an error and the consumer moved back).
	for i := range 5 {
		at := base.Add(2*time.Minute + time.Duration(i)*time.Second)
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		v := fmt.Sprintf("a%d", i)
		if err := tx.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte(v), Timestamp: at}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		w := fmt.Sprintf("b%d", i)
		if err := plain.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte(w), Timestamp: at.Add(time.Millisecond)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		want = append(want, v, w)
		read()
	}
	for _, m := range logged.all() {
		if strings.Contains(m, "disagrees") {
			t.Fatalf("logged %q", m)
		}
	}
}
