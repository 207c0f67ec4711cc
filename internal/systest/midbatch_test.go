package systest

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// TestMidBatchAbort guards against an epoch ending, and aborting, in the
// middle of a fetched batch: an event-time timer fires after each record,
// and one TxnOffsetCommit is refused. (Firing once told the coordinator
// about work from inside the batch; the aborted commit rewound the task,
// the loop went on with the rest of the batch from memory, and the refetch
// skipped a record as done: 10 outputs for 11 inputs.) The loop now tells
// the coordinator after the batch, and stops a batch at any abort.
func TestMidBatchAbort(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, input, output))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	var armed atomic.Bool
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !armed.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		return check.TxnOffsetCommitError(kr, kerr.RebalanceInProgress), nil, true
	})
	o := options(brokers, "midfetch", "i1", t.TempDir(), "echo", sluice.ExactlyOnce)
	o.Job = sluice.Job{
		Name: "timer-per-record", Emits: true, EventTime: true, Timestamp: sluice.KafkaTime,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, rec.Value)
			ctx.Timers().RegisterEventTime(ctx.Timestamp()) // fires right after this record
			return nil
		},
		OnTimer: func(sluice.Context, sluice.Timer) error { return nil },
	}
	p := startInProcess(t, o)
	p.awaitReady(t)
	cl, _ := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(input))
	defer cl.Close()
	base := time.Now()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte("v00"), Timestamp: base}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := check.ReadCommitted(context.Background(), []string{brokers}, output, awaitIdle, check.Settled(1)); err != nil {
		t.Fatal(err)
	}
	// Idle past the checkpoint interval, so the next epoch is due at its
	// first work: the scenario in which the old code ended it mid-batch.
	<-time.After(200 * time.Millisecond)
	armed.Store(true)
	var batch []*kgo.Record
	for i := 1; i <= 10; i++ {
		batch = append(batch, &kgo.Record{Value: []byte(fmt.Sprintf("v%02d", i)), Timestamp: base.Add(time.Duration(i) * time.Second)})
	}
	if err := cl.ProduceSync(context.Background(), batch...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, check.Settled(11))
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	sort.Strings(got)
	if err != nil || len(got) != 11 {
		t.Fatalf("%d outputs for 11 inputs: %v (%v)", len(got), got, err)
	}
}
