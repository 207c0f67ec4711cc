package sluice_test

import (
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
)

// On the wall clock a task reads the processing time every few records,
// and OnTimer reads it afresh; the records after a timer must not see an
// earlier time than the timer did (found by review). So ctx.Now() never
// goes back within a task, across records and the event-time timers
// fired between them.
func TestProcessingTimeNeverGoesBack(t *testing.T) {
	const records = 5000
	base := time.Now().Add(-time.Hour)
	recs := make([]*kgo.Record, records)
	for i := range recs {
		// Each record's timestamp a millisecond on: every record passes
		// the watermark over the timer the one before it set.
		recs[i] = &kgo.Record{Key: []byte("k" + strconv.Itoa(i%50)), Value: []byte("1"), Timestamp: base.Add(time.Duration(i) * time.Millisecond)}
	}
	brokers, adm := inputCluster(t, 1, recs)

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
	opts := testOptions(brokers, "now", job, t.TempDir())
	opts.Logger = slog.New(slog.DiscardHandler)
	runUntil(t, opts, consumedAll(adm, "now", records))
	mu.Lock()
	defer mu.Unlock()
	if fired == 0 || backwards != 0 {
		t.Fatalf("%d timers fired; ctx.Now() went back %d times", fired, backwards)
	}
}
