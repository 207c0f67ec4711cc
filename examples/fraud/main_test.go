package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

var t0 = time.Date(2026, time.March, 1, 9, 0, 0, 0, time.UTC)

func tx(id, card string, cents int64) []byte {
	b, _ := json.Marshal(Transaction{ID: id, Card: card, AmountCents: cents})
	return b
}

// scores renders records as "id reason,reason".
func scores(t *testing.T, recs []sluice.Record) []string {
	t.Helper()
	var out []string
	for _, r := range recs {
		var s Scored
		if err := json.Unmarshal(r.Value, &s); err != nil {
			t.Fatalf("output %q: %v", r.Value, err)
		}
		if s.Score != len(s.Reasons) || string(r.Key) != s.Card {
			t.Errorf("output %s keyed %q", r.Value, r.Key)
		}
		out = append(out, strings.TrimSpace(s.ID+" "+strings.Join(s.Reasons, ",")))
	}
	return out
}

func expect(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestScoring(t *testing.T) {
	r := rules{window: 10 * time.Minute, maxCount: 3, maxSpend: 50000, retention: 24 * time.Hour}
	h := sluicetest.New(t, newJob(r), sluicetest.Options{})
	send := func(id, card string, cents int64, at time.Duration) {
		h.Send([]byte(card), tx(id, card, cents), t0.Add(at))
	}

	send("tx-1", "c1", 2000, 0)
	send("tx-2", "c1", 3000, time.Minute)
	send("tx-8", "c2", 100, time.Minute)
	send("tx-3", "c1", 2500, 2*time.Minute)
	send("tx-4", "c1", 1500, 3*time.Minute) // the 4th in 10 minutes
	h.Kill()                                // whatever was not committed is replayed, once
	h.Restart()
	send("tx-5", "c1", 2000, 20*time.Minute)  // a new window
	send("tx-6", "c1", 45000, 21*time.Minute) // > 10 × the average of 5
	send("tx-7", "c1", 6000, 22*time.Minute)  // 53000 in the window
	h.Send([]byte("c3"), []byte("not json"), t0)
	h.Send([]byte("c4"), tx("tx-9", "c5", 100), t0)
	h.Settle()

	expect(t, "scored", scores(t, h.Output()),
		"tx-1", "tx-2", "tx-8", "tx-3", "tx-4 velocity", "tx-5", "tx-6 outlier", "tx-7 spend")
	expect(t, "suspicious", scores(t, h.SideOutput(suspicious)), "tx-4 velocity", "tx-6 outlier", "tx-7 spend")
	var dead []string
	for _, d := range h.DeadLetters() {
		for _, hd := range d.Headers {
			if hd.Key == sluice.HeaderStage {
				dead = append(dead, fmt.Sprintf("%s %s", d.Key, hd.Value))
			}
		}
	}
	expect(t, "dead letters", dead, "c3 decode", "c4 process")

	// A day of processing time without a transaction: c1's state expired,
	// so its window no longer holds tx-5 to tx-7.
	h.Advance(25 * time.Hour)
	send("tx-10", "c1", 40000, 23*time.Minute)
	h.Settle()
	got := scores(t, h.Output())
	expect(t, "after expiry", got[len(got)-1:], "tx-10")
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-window", "0s"}, {"-max-count", "0"}, {"-max-spend", "0"}, {"-retention", "1m"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sluice.New(c.options(slog.Default())); err != nil {
		t.Fatalf("the default command line's options: %v", err)
	}
}

// The program as main runs it, with the library's defaults, against an
// in-process broker: a suspicious transaction reaches the suspicious topic,
// and run returns nil once its context ends.
func TestRun(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "card-transactions", "scored-transactions", "suspicious-transactions"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg, err := parseFlags([]string{"-brokers", c.ListenAddrs()[0], "-instance", "test-1",
		"-state-dir", t.TempDir(), "-max-spend", "1000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg.options(slog.New(slog.NewTextHandler(io.Discard, nil)))) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("card-transactions"),
		kgo.ConsumeTopics("suspicious-transactions"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, cents := range []int64{600, 600} {
		r := &kgo.Record{Key: []byte("c1"), Value: tx(fmt.Sprint("tx-", i+1), "c1", cents), Timestamp: t0}
		if err := cl.ProduceSync(rctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var got []sluice.Record
	for len(got) == 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			t.Fatal("nothing suspicious within 30s")
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, sluice.Record{Key: r.Key, Value: r.Value}) })
	}
	expect(t, "suspicious", scores(t, got), "tx-2 spend")

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of its context ending")
	}
}
