package systest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
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
		{"registered, before apply", sluice.PointAfterCommit, "sluice_records_in_total>=2"},
		{"registered, after apply", sluice.PointAfterApply, "sluice_timers>=1"},
		{"fired, before apply", sluice.PointAfterCommit, "sluice_timers_fired_total>=1"},
		{"fired, after apply", sluice.PointAfterApply, "sluice_timers_fired_total>=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t, 1)
			c := newChild(t, brokers, "timers", "i1", t.TempDir(), "rising-event", sluice.ExactlyOnce)
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

// TestZombieTimer pauses the owner of a processing-time timer (SIGSTOP)
// until its session times out, lets the successor fire the timer, then
// resumes the old owner, whose loop finds the timer due before it hears
// that it lost the partition. Its epoch consumed nothing, so only the
// offsets committed with it (txsink's endUnconsumed) can tell the group
// coordinator that a member of an old generation is committing: the epoch
// must be refused, and the alert exist once.
func TestZombieTimer(t *testing.T) {
	brokers := newCluster(t, 1)
	a := newChild(t, brokers, "zombie", "a", t.TempDir(), "rising-processing", sluice.ExactlyOnce)
	b := newChild(t, brokers, "zombie", "b", t.TempDir(), "rising-processing", sluice.ExactlyOnce)
	a.start()
	if !a.logged("task restored", 30*time.Second) {
		a.dumpLog()
		t.Fatal("a did not take the partition")
	}
	b.start()
	// The first rise arms a's timer 5s ahead; pause a once that epoch
	// committed, with no transaction open.
	sendReadings(t, brokers, []string{"sensor_1,1547718200,20", "sensor_1,1547718201,21"})
	awaitGroupOffset(t, brokers, "zombie", 2)
	a.signal(syscall.SIGSTOP)
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 60*time.Second, check.Settled(1))
	if err != nil || len(recs) != 1 {
		b.dumpLog()
		t.Fatalf("the successor's alert: %d records, %v", len(recs), err)
	}
	a.signal(syscall.SIGCONT)
	if !a.logged("epoch aborted", 30*time.Second) && !a.logged("partitions released", time.Second) {
		a.dumpLog()
		t.Fatal("the resumed instance neither aborted an epoch nor released its partition")
	}
	recs, err = check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, check.Settled(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		a.dumpLog()
		t.Fatalf("%d alerts after the old owner resumed, want 1", len(recs))
	}
}

// awaitGroupOffset waits until group's committed offsets of the input sum
// to at least n.
func awaitGroupOffset(t *testing.T, brokers, group string, n int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if sum, err := check.CommittedSum(context.Background(), adm, group); err == nil && sum >= n {
			return
		}
		<-time.After(20 * time.Millisecond)
	}
	t.Fatalf("group %s did not commit %d offsets", group, n)
}
