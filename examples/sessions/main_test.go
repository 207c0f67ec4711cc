package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

var t0 = time.Date(2026, time.March, 1, 9, 0, 0, 0, time.UTC)

func summaries(t *testing.T, recs []sluice.Record) []Summary {
	t.Helper()
	var out []Summary
	for _, r := range recs {
		var s Summary
		if err := json.Unmarshal(r.Value, &s); err != nil {
			t.Fatalf("output %q: %v", r.Value, err)
		}
		if string(r.Key) != s.User {
			t.Errorf("summary of %s keyed %q", s.User, r.Key)
		}
		out = append(out, s)
	}
	return out
}

func expect(t *testing.T, got []Summary, want ...Summary) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("sessions:\n%+v\nwant\n%+v", got, want)
	}
}

// Sessions close when the watermark passes their last event plus the gap,
// earliest first; an event whose session already closed goes to late; an
// open session survives a crash and closes exactly once.
func TestSessions(t *testing.T) {
	h := sluicetest.New(t, newJob(30*time.Minute), sluicetest.Options{})
	send := func(user string, at time.Duration) { h.Send([]byte(user), []byte("click"), t0.Add(at)) }

	send("ann", 0)
	send("ann", 4*time.Minute)
	send("bob", 2*time.Minute)
	send("ann", time.Minute) // out of order, within ann's session
	h.Settle()
	expect(t, summaries(t, h.Output()))

	send("cid", 50*time.Minute) // the watermark passes bob's and ann's gaps
	send("ann", 10*time.Minute) // its session closed at 34m: late
	h.Settle()
	ann := Summary{User: "ann", Events: 3, Start: t0, End: t0.Add(4 * time.Minute), SpanSeconds: 240}
	bob := Summary{User: "bob", Events: 1, Start: t0.Add(2 * time.Minute), End: t0.Add(2 * time.Minute)}
	expect(t, summaries(t, h.Output()), bob, ann)
	if l := h.SideOutput(late); len(l) != 1 || string(l[0].Key) != "ann" {
		t.Fatalf("late: %+v, want ann's event at 10m", l)
	}

	h.Kill() // cid's session is open, in committed state
	h.Restart()
	send("dan", 3*time.Hour)
	h.Settle()
	cid := Summary{User: "cid", Events: 1, Start: t0.Add(50 * time.Minute), End: t0.Add(50 * time.Minute)}
	expect(t, summaries(t, h.Output()), bob, ann, cid)
	if d := h.DeadLetters(); len(d) != 0 {
		t.Fatalf("dead letters: %+v", d)
	}
}

func TestFlags(t *testing.T) {
	if _, err := parseFlags([]string{"-gap", "0s"}, io.Discard); err == nil {
		t.Error("-gap 0s accepted")
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
// in-process broker: a closed session reaches the output topic, and run
// returns nil once its context ends.
func TestRun(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "page-views", "sessions", "sessions-late"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg, err := parseFlags([]string{"-brokers", c.ListenAddrs()[0], "-instance", "test-1",
		"-state-dir", t.TempDir(), "-gap", "1m", "-out-of-orderness", "0s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg.options(slog.New(slog.NewTextHandler(io.Discard, nil)))) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("page-views"),
		kgo.ConsumeTopics("sessions"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, e := range []struct {
		user string
		at   time.Duration
	}{{"ann", 0}, {"ann", 30 * time.Second}, {"bob", 5 * time.Minute}} {
		if err := cl.ProduceSync(rctx, &kgo.Record{Key: []byte(e.user), Timestamp: t0.Add(e.at)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var got []Summary
	for len(got) == 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			t.Fatal("no session within 30s")
		}
		fs.EachRecord(func(r *kgo.Record) {
			var s Summary
			if err := json.Unmarshal(r.Value, &s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		})
	}
	expect(t, got, Summary{User: "ann", Events: 2, Start: t0, End: t0.Add(30 * time.Second), SpanSeconds: 30})

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
