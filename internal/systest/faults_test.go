package systest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// TestBrokerFaults injects broker faults with kfake's request controls
// while an exactly-once instance runs, and checks with a read_committed
// reader that every input is reflected exactly once: no duplicate, no loss.
func TestBrokerFaults(t *testing.T) {
	tests := []struct {
		name string
		// arm installs the fault, which fires once, on the next
		// matching request; the test checks with fired that it did.
		arm func(c *kfake.Cluster, fired *atomic.Bool)
		// txnTimeout, if set, replaces the instance's transaction
		// timeout.
		txnTimeout time.Duration
		// pipelined processes each epoch while the one before commits
		// (Options.PipelinedEpochs).
		pipelined bool
	}{
		{
			// The broker aborts the transaction on its timeout while
			// EndTxn is held; the late EndTxn is fenced.
			name:       "EndTxn slower than the transaction timeout",
			txnTimeout: 2 * time.Second,
			arm: func(c *kfake.Cluster, fired *atomic.Bool) {
				c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
					if fired.CompareAndSwap(false, true) {
						c.SleepControl(func() { <-time.After(3 * time.Second) }) // the fault itself
					}
					return nil, nil, false
				})
			},
		},
		{
			name: "TxnOffsetCommit answers ILLEGAL_GENERATION",
			arm:  func(c *kfake.Cluster, fired *atomic.Bool) { failTxnOffsetCommit(c, kerr.IllegalGeneration, fired) },
		},
		{
			name: "TxnOffsetCommit answers REBALANCE_IN_PROGRESS",
			arm:  func(c *kfake.Cluster, fired *atomic.Bool) { failTxnOffsetCommit(c, kerr.RebalanceInProgress, fired) },
		},
		{
			name: "produce answers NOT_LEADER_FOR_PARTITION",
			arm: func(c *kfake.Cluster, fired *atomic.Bool) {
				c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
					fired.Store(true)
					return check.ProduceError(kreq, kerr.NotLeaderForPartition), nil, true
				})
			},
		},
		{
			name: "transaction and group coordinators move",
			arm: func(c *kfake.Cluster, fired *atomic.Bool) {
				c.RehashCoordinators()
				fired.Store(true)
			},
		},
	}
	// The faults of the flush, EndTxn and the coordinators again, with
	// the commit overlapping the next epoch.
	for _, i := range []int{0, 3, 4} {
		tt := tests[i]
		tt.name += ", pipelined epochs"
		tt.pipelined = true
		tests = append(tests, tt)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, input, output), kip848Heartbeat)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			brokers := c.ListenAddrs()[0]
			f := newFeeder(t, brokers, 40, uint64(60+i))
			o := options(brokers, "faults", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
			if tt.txnTimeout > 0 {
				o.TransactionTimeout = tt.txnTimeout
				o.Checkpoint.Timeout = 2 * tt.txnTimeout
			}
			o.PipelinedEpochs = tt.pipelined
			p := startInProcess(t, o)
			p.awaitReady(t)
			f.produce(300, 0)
			if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
				t.Fatalf("before the fault: %v", rep)
			}
			var fired atomic.Bool
			tt.arm(c, &fired)
			for range 10 {
				f.produce(50, 0)
			}
			rep := awaitAggregate(t, brokers, f, awaitIdle)
			if !rep.OK() {
				t.Fatalf("after the fault: %v", rep)
			}
			if !fired.Load() {
				t.Fatal("the fault never fired")
			}
			t.Logf("%s: %v", tt.name, rep)
		})
	}
}

// failTxnOffsetCommit answers the next TxnOffsetCommit with err for every
// partition.
func failTxnOffsetCommit(c *kfake.Cluster, err *kerr.Error, fired *atomic.Bool) {
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fired.Store(true)
		return check.TxnOffsetCommitError(kreq, err), nil, true
	})
}
