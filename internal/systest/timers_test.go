package systest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/engine"
)

// TestTimerCrash kills a real instance process (SIGKILL from its own hook)
// around a timer of rising-temperature in event time and checks that the
// timer fires exactly once: a timer whose registration committed fires
// after the restart; one that fired in a committed epoch never fires again,
// whether the crash came before the backend applied that epoch (the
// restore replays the changelog's tail) or after.
//
// sensor_1 rises at 201 (timer at 211); the reading at 211 moves the
// watermark past it; sensor_9 at 300 then moves it far beyond, so a timer
// that survived by mistake would fire a second time.
func TestTimerCrash(t *testing.T) {
	tests := []struct {
		name, point, when string
	}{
		// Both readings are in a committed epoch: the timer is registered
		// in Kafka, not yet in the backend.
		{"registered, before apply", engine.PointAfterCommit, "sluice_records_in_total>=2"},
		{"registered, after apply", engine.PointAfterApply, "sluice_timers>=1"},
		{"fired, before apply", engine.PointAfterCommit, "sluice_timers_fired_total>=1"},
		{"fired, after apply", engine.PointAfterApply, "sluice_timers_fired_total>=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t, 1)
			c := newChild(t, brokers, "timers", "i1", t.TempDir(), "rising-event", engine.ExactlyOnce)
			c.start("SYSTEST_CRASH_AT="+tt.point, "SYSTEST_CRASH_WHEN="+tt.when)
			sendReadings(t, brokers, []string{"sensor_1,1547718200,20", "sensor_1,1547718201,21"})
			fired := strings.HasPrefix(tt.name, "fired")
			if fired {
				sendReadings(t, brokers, []string{"sensor_1,1547718211,22"})
			}
			if !c.wait(60*time.Second) || !c.crashed() {
				c.dumpLog()
				t.Fatalf("instance did not crash at %s when %s", tt.point, tt.when)
			}
			c.start()
			if !fired {
				sendReadings(t, brokers, []string{"sensor_1,1547718211,22"})
			}
			sendReadings(t, brokers, []string{"sensor_9,1547718300,0"})
			recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, check.Settled(1))
			if err != nil {
				c.dumpLog()
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs {
				got = append(got, fmt.Sprintf("%s %s", r.Key, r.Value))
			}
			if want := []string{`sensor_1 {"id":"sensor_1","rising_for":"10s"}`}; !slices.Equal(got, want) {
				c.dumpLog()
				t.Fatalf("alerts after a crash %s: %q, want %q", tt.name, got, want)
			}
		})
	}
}
