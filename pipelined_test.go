package sluice_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// With Options.PipelinedEpochs, the inputs polled while an epoch's flush
// waits for the broker are processed (sluice_overlapped_records_total), but
// none of their outputs reaches Kafka before that epoch's transaction
// ended: they go out in the next one. Whether the epoch then commits, or
// aborts and takes the next one with it, every input is reflected exactly
// once in the read_committed output and in the task files.
//
// The flush is held deterministically: the broker sleeps on the instance's
// first produce request after the first half of the input was consumed
// (the next input's output), and the second half comes after that epoch's
// barrier, until the test has seen it processed.
func TestPipelinedEpochs(t *testing.T) {
	for _, tt := range []struct {
		name  string
		abort bool // the held epoch's TxnOffsetCommit fails
	}{
		{"the epoch commits", false},
		{"the epoch aborts and takes the next with it", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			brokers := c.ListenAddrs()
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			adm := kadm.NewClient(cl)
			app := "pipelined"
			state := filepath.Join(t.TempDir(), "s")
			opts := aggregateOptions(brokers, app, state)
			opts.PipelinedEpochs = true
			opts.Checkpoint.Timeout = 40 * time.Second // the test holds a flush
			// barriers counts the epochs ended once the hold below was
			// armed: the first is the held epoch's (no epoch ends
			// without work, and the first half was committed), whose
			// barrier may come before or after its produce reaches the
			// broker (the flush sends what lingers); committedAt is the group's committed offsets (their
			// sum) and outputsAt the outputs a read_committed reader
			// sees when the first epoch committed after it was released
			// (the loop's goroutine calls the hook).
			var watching, sleeping, released atomic.Bool
			var barriers atomic.Int32
			committedAt, outputsAt := int64(-1), -1
			opts.Hook = func(p string) {
				switch {
				case p == sluice.PointBeforePreCommit && watching.Load():
					barriers.Add(1)
				case p == sluice.PointAfterCommit && released.Load() && committedAt < 0:
					sum, err := check.CommittedSum(context.Background(), adm, app)
					if err != nil {
						t.Error(err)
					}
					committedAt = sum
					outputsAt = len(readOutputs(t, brokers, "out", kgo.ReadCommitted()))
				}
			}
			reg := opts.Registry.(*prometheus.Registry)
			metric := func(name string, labels ...string) float64 {
				v, err := check.MetricSum(reg, name, labels...)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			r := startReady(t, opts)

			const half = applyKeys * applyPerKey / 2
			produceAggregateRange(t, brokers, 0, half)
			waitUntil(t, "the first half consumed", func() bool { return consumedAll(adm, app, half)(r.inst) })

			topics, err := adm.ListTopics(context.Background(), "in")
			if err != nil {
				t.Fatal(err)
			}
			inID := topics["in"].ID
			release := make(chan struct{})
			var armed atomic.Bool
			armed.Store(true)
			c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				if writesTo(kreq.(*kmsg.ProduceRequest), "in", inID) || !armed.CompareAndSwap(true, false) {
					return nil, nil, false
				}
				sleeping.Store(true)
				c.SleepControl(func() { <-release }) // holds the epoch's flush
				return nil, nil, false
			})
			if tt.abort {
				c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
					return check.TxnOffsetCommitError(kreq, kerr.IllegalGeneration), nil, true
				})
			}
			// One input opens an epoch whose produce is held; the rest
			// arrives once its barrier passed, while its flush waits.
			watching.Store(true)
			produceAggregateRange(t, brokers, half, half+1)
			waitUntil(t, "the barrier of an epoch whose produce is held", func() bool { return barriers.Load() > 0 && sleeping.Load() })
			produceAggregateRange(t, brokers, half+1, 2*half)
			overlapped := func() bool { return metric("sluice_overlapped_records_total") >= half-1 }
			waitUntil(t, "the rest processed behind the held epoch", overlapped)
			if out := len(readOutputs(t, brokers, "out", kgo.ReadUncommitted())); out > half+1 {
				t.Fatalf("%d outputs in the log while the epoch of input %d commits: more than the %d inputs before it, so the next epoch's outputs were produced into it", out, half, half+1)
			}
			released.Store(true)
			close(release)

			waitUntil(t, "the whole input consumed", func() bool { return consumedAll(adm, app, 2*half)(r.inst) })
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			// The held epoch committed its own offsets, not the
			// consumer's positions, which were past the second half.
			if !tt.abort && committedAt != half+1 {
				t.Fatalf("the held epoch committed offsets adding up to %d, want %d", committedAt, half+1)
			}
			// And its outputs alone: the next epoch's were held.
			if !tt.abort && outputsAt != half+1 {
				t.Fatalf("%d outputs committed with the held epoch, want %d", outputsAt, half+1)
			}
			aborts := metric("sluice_transactions_total", "result", "abort")
			if tt.abort != (aborts > 0) {
				t.Fatalf("%v transactions aborted; want them to abort: %v", aborts, tt.abort)
			}
			outputs, err := check.ReadCommitted(context.Background(), brokers, "out", time.Second, check.Settled(2*half))
			if err != nil {
				t.Fatal(err)
			}
			if rep := check.Aggregate(aggregateInputs(2*half), outputs); !rep.OK() {
				t.Fatalf("read_committed output: %v", rep)
			}
			checkAggregations(t, state, app)
		})
	}
}

// writesTo reports whether the produce request writes to the topic of that
// name or id (requests from v13 on carry the id alone).
func writesTo(req *kmsg.ProduceRequest, topic string, id [16]byte) bool {
	for _, rt := range req.Topics {
		if rt.Topic == topic || rt.TopicID == id {
			return true
		}
	}
	return false
}

// readOutputs reads topic at the isolation level as of now.
func readOutputs(t *testing.T, brokers []string, topic string, level kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), brokers, topic, 300*time.Millisecond, nil, kgo.FetchIsolationLevel(level))
	if err != nil {
		t.Error(err)
	}
	return recs
}

// aggregateInputs are the values produceAggregateRange wrote from 0 to n,
// per key, in order.
func aggregateInputs(n int) map[string][]int64 {
	in := map[string][]int64{}
	for v := range n {
		k := fmt.Sprintf("k%02d", v%applyKeys)
		in[k] = append(in[k], int64(v))
	}
	return in
}

// Pipelined epochs overlap a Kafka transaction's commit: at-least-once,
// which has none, refuses the option rather than ignoring it.
func TestPipelinedEpochsNeedExactlyOnce(t *testing.T) {
	opts := aggregateOptions([]string{"127.0.0.1:1"}, "pipelined-alos", t.TempDir())
	opts.Guarantee, opts.PipelinedEpochs = sluice.AtLeastOnce, true
	if _, err := sluice.New(opts); err == nil || !strings.Contains(err.Error(), "PipelinedEpochs needs Options.Guarantee exactly_once") {
		t.Fatalf("New = %v, want the option refused", err)
	}
}
