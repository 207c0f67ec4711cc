package sluice_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/testhook"
	"github.com/sluicehq/sluice/jobs"
)

// An instance that has joined its group but not yet received its
// assignment (the broker holds its SyncGroup) is not ready, and not quiet:
// it does not know its tasks yet. Before, it was both: a member with no
// task restoring. Once the assignment arrives, it is ready only with all
// four tasks running.
func TestNotReadyBeforeTheAssignment(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	held, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	c.ControlKey(int16(kmsg.SyncGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl() // the first SyncGroup only; the broker then answers it
		first.Do(func() {
			close(held)
			c.SleepControl(func() { <-release })
		})
		return nil, nil, false
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release) // a failure before the release: free the broker
		}
	})

	opts := testOptions(c.ListenAddrs(), "ready", jobs.Echo(), t.TempDir())
	opts.OutputTopic = "out"
	// The client gives up on a SyncGroup after the rebalance timeout (4 s
	// of the tests' 6 s session) and sends another, which the broker
	// answers: on a slow machine the probes below could outlast it.
	opts.SessionTimeout = 90 * time.Second // and so a rebalance timeout of a minute
	r := startInstance(t, opts)
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no SyncGroup within a minute")
	}
	// The instance joined (its JoinGroup was answered before its
	// SyncGroup was sent). Two probes: the second is answered by an
	// iteration that began after the first, and so after the readiness
	// of an iteration that ran after the join was set.
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		quiet, err := testhook.Quiet(ctx, r.inst)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if quiet {
			t.Error("quiet while its SyncGroup is held: it does not know its tasks yet")
		}
	}
	if r.inst.Ready() {
		t.Error("ready while its SyncGroup is held: it does not know its tasks yet")
	}
	close(release)
	waitUntil(t, "ready after the assignment", r.inst.Ready)
	if n := runningTasks(t, opts); n != 4 {
		t.Errorf("ready with %v running tasks, want 4", n)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}
