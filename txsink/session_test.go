package txsink

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition revoked from the session while an epoch that consumed nothing
// (timers fired) is open: the epoch must abort, as one that consumed does
// (GroupTransactSession's rule b). Ending such an epoch outside the session
// once committed it.
func TestUnconsumedEpochAbortsAfterRevoke(t *testing.T) {
	for _, unconsumed := range []bool{false, true} {
		name := "consumed"
		if unconsumed {
			name = "unconsumed"
		}
		t.Run(name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in", "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			brokers := c.ListenAddrs()
			ctx := context.Background()
			prod, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			defer prod.Close()
			for p := int32(0); p < 2; p++ {
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "in", Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			var revokedA []int32
			revCh := make(chan struct{}, 8)
			mk := func(id string, onRev func(map[string][]int32)) Session {
				s, err := NewExactlyOnce(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"),
					kgo.TransactionalID(id), kgo.InstanceID(id), kgo.BlockRebalanceOnPoll(), kgo.DisableAutoCommit(),
					kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
					kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
					kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(4*time.Second), kgo.HeartbeatInterval(300*time.Millisecond),
					kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
						if onRev != nil {
							onRev(ps)
						}
					}))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			a := mk("a", func(ps map[string][]int32) {
				mu.Lock()
				revokedA = append(revokedA, ps["in"]...)
				mu.Unlock()
				if len(ps["in"]) > 0 {
					revCh <- struct{}{}
				}
			})
			defer a.Close()
			got := 0
			for got < 2 {
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				got += len(a.PollRecords(pctx, 10).Records())
				cancel()
			}
			if err := a.Begin(); err != nil {
				t.Fatal(err)
			}
			a.Produce(ctx, &kgo.Record{Topic: "out", Partition: 0, Value: []byte("epoch1")}, nil)
			if ok, err := a.End(ctx, true, nil); !ok || err != nil {
				t.Fatalf("first epoch: %v %v", ok, err)
			}
			// A timer-only epoch opens.
			if err := a.Begin(); err != nil {
				t.Fatal(err)
			}
			a.Produce(ctx, &kgo.Record{Topic: "out", Partition: 0, Value: []byte("timer fired")}, nil)

			// b joins; a lets the rebalance run; cooperative-sticky revokes a partition from a.
			b := mk("b", nil)
			defer b.Close()
			bctx, bstop := context.WithCancel(ctx)
			defer bstop()
			go func() {
				for bctx.Err() == nil {
					pctx, cancel := context.WithTimeout(bctx, 100*time.Millisecond)
					b.PollRecords(pctx, 10)
					cancel()
					b.AllowRebalance()
				}
			}()
			deadline := time.After(20 * time.Second)
		wait:
			for {
				a.AllowRebalance()
				select {
				case <-revCh:
					break wait
				case <-time.After(50 * time.Millisecond):
				case <-deadline:
					t.Fatal("no revoke")
				}
			}
			var offs map[string]map[int32]kgo.EpochOffset
			if unconsumed {
				// What the engine passes: every task that wrote a marker (both, the revoked one still running until the next poll).
				offs = map[string]map[int32]kgo.EpochOffset{"in": {0: {Epoch: -1, Offset: 1}, 1: {Epoch: -1, Offset: 1}}}
			}
			ok, err := a.End(ctx, true, offs)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				t.Errorf("the epoch committed although a partition was revoked during it")
			}
		})
	}
}

// At-least-once, an abort rewinds a partition the group has no commit for
// to where consuming began, as the transactional session does: the
// group's commits alone left the consumer past the records the abort
// dropped.
func TestAtLeastOnceAbortRewindsAnUncommittedPartition(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	ctx := context.Background()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func() {
		t.Helper()
		var recs []*kgo.Record
		for range 10 {
			recs = append(recs, &kgo.Record{Topic: "in", Value: []byte("x")})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce()
	s, err := NewAtLeastOnce(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"),
		kgo.BlockRebalanceOnPoll(), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// poll returns the offset of the first record of the next poll that
	// has any.
	poll := func() int64 {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			recs := s.PollRecords(pctx, 100).Records()
			cancel()
			s.AllowRebalance()
			if len(recs) > 0 {
				return recs[0].Offset
			}
		}
		t.Fatal("no records within a minute")
		return -1
	}
	if at := poll(); at != 0 {
		t.Fatalf("first poll from offset %d, want 0", at)
	}
	if ok, err := s.End(ctx, false, nil); ok || err != nil {
		t.Fatalf("abort: %v %v", ok, err)
	}
	produce() // so that a consumer left past the first records gets some too
	if at := poll(); at != 0 {
		t.Fatalf("after the abort, records came again from offset %d, want 0", at)
	}
}
